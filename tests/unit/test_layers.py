"""The floor plan holds: import contracts (import-linter), and what import-linter cannot see (AST checks).

See ARCHITECTURE.md for the layers and why they are what they are.
"""
import ast
import os
import pathlib
import shutil
import subprocess
import sys
from collections import defaultdict
from typing import Dict, Iterator, List, Set, Tuple

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / "raytrain_nb"
LINT_IMPORTS = pathlib.Path(sys.executable).parent / "lint-imports"
MAX_LINES = 400


def _modules() -> Iterator[Tuple[pathlib.Path, ast.Module, List[str]]]:
    for path in sorted(PACKAGE.rglob("*.py")):
        text = path.read_text()
        yield path, ast.parse(text), text.split("\n")


def _room(path: pathlib.Path) -> str:
    """The package a module belongs to for the private-member rule (group, worker, ..., or the module itself)."""
    rel = path.relative_to(PACKAGE).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    if parts[:1] == ["_internal"] and len(parts) >= 3:
        return ".".join(parts[:2])
    if parts[:2] == ["notebook", "dashboard"]:
        return "notebook.dashboard"
    return ".".join(parts[:1] if parts[:1] == ["notebook"] else parts)


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


def _private_names_by_room() -> Dict[str, Set[str]]:
    """Private attributes and methods our classes define, by the room (package) that defines them."""
    rooms: Dict[str, Set[str]] = defaultdict(set)
    for path, tree, _ in _modules():
        room = _room(path)
        for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
            for node in ast.walk(cls):
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and _is_private(node.name):
                    rooms[room].add(node.name)
                elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) \
                        and isinstance(node.value, ast.Name) and node.value.id == "self" and _is_private(node.attr):
                    rooms[room].add(node.attr)
    return rooms


def _is_private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _reaches(tree: ast.Module, room: str, rooms: Dict[str, Set[str]]) -> List[str]:
    """``obj._name`` where ``_name`` is private to another room's classes, and imports of private names."""
    mine = rooms.get(room, set())
    foreign = set().union(*(names for r, names in rooms.items() if r != room)) - mine
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in foreign:
            if not (isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
                found.append(f"{node.lineno} {ast.unparse(node)}")
        elif isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").startswith("raytrain_nb")):
            found += [f"{node.lineno} imports {a.name} from {node.module}" for a in node.names if _is_private(a.name)]
    return found


def test_no_reaches_into_another_packages_private_members():
    """``group._anything`` from outside ``_internal/group/`` (and the same for every package) is a defect:
    the owner offers a named method instead. Importing another module's private name counts too."""
    rooms = _private_names_by_room()
    found = [f"{path.relative_to(REPO)}:{hit}" for path, tree, _ in _modules() for hit in _reaches(tree, _room(path), rooms)]
    assert not found, "reaches into private members:\n" + "\n".join(found)


def test_the_private_member_rule_can_fail():
    rooms = _private_names_by_room()
    planted = ast.parse("from ..group.formation import _first\ndef f(group):\n    return group._state_lock, self_ok()\n")
    assert _reaches(planted, "_internal.train", rooms) == ["1 imports _first from group.formation",
                                                            "3 group._state_lock"]
    assert _reaches(planted, "_internal.group", rooms) == ["1 imports _first from group.formation"]


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
