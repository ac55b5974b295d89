"""The floor plan holds: import contracts (import-linter), and what import-linter cannot see (AST checks).

See ARCHITECTURE.md for the layers and why they are what they are.
"""
import ast
import os
import pathlib
import shutil
import subprocess
import sys
from typing import Iterator, List, Set, Tuple

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / "raytrain_nb"
LINT_IMPORTS = pathlib.Path(sys.executable).parent / "lint-imports"
MAX_LINES = 400


def _modules() -> Iterator[Tuple[pathlib.Path, ast.Module, List[str]]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        yield path, ast.parse(text), text.split("\n")


def _function_imports(tree: ast.Module) -> Iterator[ast.stmt]:
    seen: Set[int] = set()
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in seen:
                    seen.add(id(node))
                    yield node


def _lint_imports(cwd: pathlib.Path) -> subprocess.CompletedProcess:
    if not LINT_IMPORTS.exists():
        pytest.fail(f"{LINT_IMPORTS} is missing: import-linter is a dev dependency (make test installs it)")
    env = dict(os.environ, PYTHONPATH=str(cwd))
    return subprocess.run([str(LINT_IMPORTS), "--no-cache"], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_import_contracts_hold():
    out = _lint_imports(REPO)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "0 broken" in out.stdout and "4 kept" in out.stdout


@pytest.mark.parametrize("module, line, contract", [
    # a worker-side module importing the driver side (even inside a function)
    ("_internal/worker/cell.py", "def _up():\n    from ..group import recovery  # x\n", "the worker never imports the driver"),
    # the core importing the notebook layer
    ("_internal/group/tables.py", "def _up():\n    from ...notebook import ui  # x\n", "notebook above train"),
    # the driver-side core importing IPython directly
    ("_internal/checkpoint/storage.py", "def _ip():\n    import IPython  # x\n", "never imports IPython"),
])
def test_a_broken_layer_is_caught(tmp_path, module, line, contract):
    shutil.copytree(PACKAGE, tmp_path / "raytrain_nb", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "pyproject.toml", tmp_path / "pyproject.toml")
    with open(tmp_path / "raytrain_nb" / module, "a") as fh:
        fh.write("\n\n" + line)
    out = _lint_imports(tmp_path)
    assert out.returncode != 0, out.stdout[-2000:]
    broken = out.stdout[out.stdout.index("Broken contracts"):] if "Broken contracts" in out.stdout else out.stdout
    assert contract in " ".join(broken.split())


#: Functions that import a module the *user* names (to preload or reload it on the workers).
#: ... or an optional third-party library its caller names (``extras.require("transformers")``).
_USER_NAMED = {("_internal/worker/actor.py", "_preload"), ("_internal/group/execution.py", "_reload"),
               ("_internal/extras.py", "require")}


def test_no_lazy_imports_that_import_linter_cannot_see():
    """``importlib.import_module`` / ``__import__`` of our own modules, or a module ``__getattr__``, hide an
    import from the contracts; only the public package root resolves names lazily (``raytrain_nb.WorkerGroup``)."""
    found = []
    for path, tree, _ in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        if rel == "__init__.py":
            continue
        user_named = [fn for fn in ast.walk(tree) if isinstance(fn, ast.FunctionDef) and (rel, fn.name) in _USER_NAMED]
        allowed = {id(n) for fn in user_named for n in ast.walk(fn)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and node.args and id(node) not in allowed:
                fn = node.func
                name = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", "")
                owner = fn.value.id if isinstance(fn, ast.Attribute) and isinstance(fn.value, ast.Name) else ""
                if name in ("import_module", "__import__") or (name == "reload" and owner == "importlib"):
                    found.append(f"{rel}:{node.lineno} {name}({ast.unparse(node.args[0])})")
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == "__getattr__":
                found.append(f"{rel}:{node.lineno} module __getattr__")
    assert not found, "lazy imports import-linter cannot see:\n" + "\n".join(found)


def test_imports_inside_functions_say_why():
    """Only heavy or optional dependencies are imported inside a function, each with a one-line reason
    (a comment on the line, or on the line before)."""
    missing = []
    for path, tree, lines in _modules():
        for node in _function_imports(tree):
            line, before = lines[node.lineno - 1], lines[node.lineno - 2].strip()
            if "#" not in line and not before.startswith("#"):
                missing.append(f"{path.relative_to(REPO)}:{node.lineno}: {line.strip()}")
    assert not missing, "imports inside functions without a reason:\n" + "\n".join(missing)


#: Private members of other libraries' objects that we use, each with why (no name our code defines may be here).
FOREIGN_PRIVATE = {
    "_parent": "fsspec: AbstractFileSystem._parent(path), the parent of a path in that filesystem's terms",
    "_strip_protocol": "fsspec: the path a filesystem uses for a URL",
    "_actor_id": "Ray: an actor handle's id, to ask the GCS whether it died",
    "_exit": "os._exit: the keeper process ends at once when its parent is gone",
    "_current_frames": "sys: every thread's stack, for a stuck rank's stack",
    "_LIB": "LightGBM: its C library handle, to free a booster's network",
    "_build_python_executable_command_memory_profileable": "Ray: how the lean head starts its processes",
    "_shared_state": "Accelerate: its singletons' state, cleared when the group re-forms",
    "_reset_state": "Accelerate: resets its singletons",
    "_ray_auto_init": "Ray Tune: its auto-init hook, wrapped to connect to the user's cluster",
    "_parameters": "torch: a module's own parameters, replaced when a sharded model is sharded again (FSDP2)",
    "_forward_pre_hooks": "torch: a module's hooks; FSDP2's are removed to shard a model again over a new mesh",
    "_forward_hooks": "torch: as _forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs": "torch: as _forward_pre_hooks",
    "_forward_hooks_with_kwargs": "torch: as _forward_pre_hooks",
    "_forward_hooks_always_called": "torch: as _forward_pre_hooks",
    "_state_dict_pre_hooks": "torch: as _forward_pre_hooks (FSDP2's state-dict hooks of the old mesh go too)",
    "_load_state_dict_pre_hooks": "torch: as _state_dict_pre_hooks",
    "_load_state_dict_post_hooks": "torch: as _state_dict_pre_hooks (each FSDP2 parameter's copy into its shard)",
    "_orig_cls_mro_index": "torch FSDP2: where a sharded module's own class is in its class's MRO",
    "_world": "torch: every process group this rank is in (its pg_map), whose collectives an interrupt counts",
    "_get_sequence_number_for_group": "torch: how many collectives a group issued, alike on every rank when an "
                                      "interrupt left none half done (the group is kept)",
}
#: Our markers on other libraries' objects (a function we wrapped, a DDP wrapper, IPython's shell): prefixed so
#: they never clash with the object's own attributes.
MARKER_PREFIX = "_rtnb"


def _defined_private_names() -> Set[str]:
    """Private names our code defines: functions, classes, ``self._x`` attributes and other names it binds (not
    what it sets on another library's objects: ``tune._ray_auto_init = ours``)."""
    names: Set[str] = set()
    for _, tree, _ in _modules():
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and _is_private(node.name):
                names.add(node.name)
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _is_private(node.attr) \
                    and isinstance(node.value, ast.Name) and node.value.id == "self":
                names.add(node.attr)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and _is_private(node.id):
                names.add(node.id)
    return names


def _is_private(name: str) -> bool:
    """``_x``, not ``__x__`` nor a protocol's ``_x_`` (IPython's ``_repr_mimebundle_``)."""
    return name.startswith("_") and not name.startswith("__") and not name.endswith("_")


def _reaches(tree: ast.Module) -> List[str]:
    """``obj._name`` on anything but ``self`` / ``cls`` (unless another library's, listed, or our marker), and
    imports of private names from our modules."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            if isinstance(node.value, ast.Name) and node.value.id in ("self", "cls"):
                continue
            if node.attr in FOREIGN_PRIVATE or node.attr.startswith(MARKER_PREFIX) or node.attr == "_internal":
                continue
            found.append(f"{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("raytrain_nb")):
            found += [f"{node.lineno} imports {a.name} from {node.module}" for a in node.names if _is_private(a.name)]
    return found


def test_no_module_reaches_into_another_objects_private_members():
    """``group._anything`` anywhere but in the group's own methods is a defect, inside a package or across: the
    owner offers a public member instead (the group's parts are handed its core, and use the core's public
    members). Importing another module's private name counts too. Other libraries' private members we use are
    listed, with why; ``raytrain_nb._internal`` is the package's own layout."""
    found = [f"{path.relative_to(REPO)}:{hit}" for path, tree, _ in _modules() for hit in _reaches(tree)]
    assert not found, "reaches into private members:\n" + "\n".join(found)


def test_the_foreign_list_hides_none_of_ours():
    ours = _defined_private_names() & set(FOREIGN_PRIVATE)
    assert not ours, f"names our code defines cannot be listed as another library's: {sorted(ours)}"


def test_the_private_member_rule_can_fail():
    planted = ast.parse("from ..group.formation import _first\ndef f(group, core):\n"
                        "    return group._state_lock, core.formation._spawn(), self._ok, fs._parent('x')\n")
    assert _reaches(planted) == ["1 imports _first from group.formation", "3 group._state_lock",
                                 "3 core.formation._spawn"]


def test_the_group_is_parts_not_mixins():
    """No mixins in ``group/``: every class there has at most one base of ours, and none is a mixin."""
    ours = {node.name for _, tree, _ in _modules() for node in ast.walk(tree) if isinstance(node, ast.ClassDef)}
    found = []
    for path in sorted((PACKAGE / "_internal" / "group").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = [ast.unparse(b).split(".")[-1] for b in node.bases]
                if node.name.endswith("Mixin") or len([b for b in bases if b in ours]) > 1:
                    found.append(f"{path.name}: class {node.name}({', '.join(bases)})")
    assert not found, "mixins in group/:\n" + "\n".join(found)


def test_every_module_is_small_and_says_its_job():
    problems = []
    for path, tree, lines in _modules():
        rel = path.relative_to(REPO)
        if len(lines) >= MAX_LINES:
            problems.append(f"{rel}: {len(lines)} lines (split it by job: at most {MAX_LINES - 1})")
        doc = ast.get_docstring(tree)
        if path.name != "__init__.py" or path.parent == PACKAGE:
            if not doc or not doc.split("\n")[0].strip():
                problems.append(f"{rel}: no one-line docstring saying its job")
    assert not problems, "\n".join(problems)
