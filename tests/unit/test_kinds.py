"""Group kinds: chosen once from the config, they answer every question that was a string check of the backend."""
from __future__ import annotations

import ast
import pathlib

import pytest

import raytrain_nb  # noqa: F401 - registers the framework backends, as any use of the package does
from raytrain_nb._internal.errors import GroupError
from raytrain_nb._internal.group import kinds
from raytrain_nb._internal.group.config import GroupConfig
from raytrain_nb._internal.worker import framework as frameworks

PACKAGE = pathlib.Path(raytrain_nb.__file__).parent


@pytest.mark.parametrize("backend, gpus, kind, torch_backend, preload", [
    (None, 0, kinds.TorchProcessGroup, "gloo", True),
    (None, 1, kinds.TorchProcessGroup, "nccl", True),
    ("gloo", 0, kinds.TorchProcessGroup, "gloo", True),
    ("none", 0, kinds.PeersThroughDriver, "none", False),
    ("xgboost", 0, kinds.PeersThroughDriver, "none", False),
    ("lightgbm", 0, kinds.PeersThroughDriver, "none", False),
    ("tensorflow", 0, kinds.FreshProcesses, "none", False),
])
def test_each_backend_has_one_kind(backend, gpus, kind, torch_backend, preload):
    config = GroupConfig(backend=backend, gpus_per_worker=gpus)
    got = config.kind
    assert type(got) is kind and got.torch_backend == torch_backend == config.resolved_backend
    assert bool(got.preload) is preload
    assert [got.process_group, got.copies_through_driver, got.fresh_processes].count(True) == 1
    assert (got.framework is not None) == (backend in frameworks.names())
    assert config.framework == (backend if backend in frameworks.names() else None)


def test_backend_names_come_from_the_registry_and_feed_the_magic():
    from raytrain_nb.notebook.magics import DistributedMagics

    names = kinds.backend_names()
    assert names[:3] == ("gloo", "nccl", "none") and set(frameworks.names()) <= set(names)
    assert all(f"{name}" in DistributedMagics.distributed.__doc__ for name in names)  # --backend's choices
    with pytest.raises(GroupError, match=r"backend='mpi' is unknown: use one of gloo, nccl, none, xgboost"):
        GroupConfig(backend="mpi")


def test_a_new_framework_backend_is_one_registration(monkeypatch):
    class Jax(frameworks.FrameworkBackend):
        name = "jaxlike"
        fresh_processes = "its distributed runtime starts once per process"

    monkeypatch.setitem(frameworks._REGISTRY, "jaxlike", Jax())
    assert "jaxlike" in kinds.backend_names()
    assert type(GroupConfig(backend="jaxlike").kind) is kinds.FreshProcesses


def _backend_string_checks(tree: ast.AST):
    """Comparisons of a ``backend`` / ``framework`` value with a backend's name."""
    names = set(kinds.backend_names())
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            consts = [s.value for s in sides if isinstance(s, ast.Constant) and isinstance(s.value, str)]
            named = [s for s in sides if "backend" in ast.unparse(s) or "framework" in ast.unparse(s)]
            if named and any(c in names for c in consts):
                yield node.lineno, ast.unparse(node)
        if isinstance(node, ast.Call) and ast.unparse(node.func) in ("frameworks.find", "frameworks.get"):
            yield node.lineno, ast.unparse(node)


def test_no_string_checks_of_the_backend_outside_the_kinds():
    found = []
    for folder in ("_internal/group", "notebook"):
        for path in sorted((PACKAGE / folder).rglob("*.py")):
            if path.name == "kinds.py":
                continue
            for line, text in _backend_string_checks(ast.parse(path.read_text())):
                found.append(f"{path.relative_to(PACKAGE)}:{line} {text}")
    assert not found, "ask the group's kind (group/kinds.py) instead:\n" + "\n".join(found)


def test_the_scan_can_fail():
    planted = ast.parse('if self.backend != "none":\n    pass\nb = frameworks.find(x)\n')
    assert [line for line, _ in _backend_string_checks(planted)] == [1, 3]
