"""The objects reachable from a namespace's names, each with the path a user would write.

A model may be bound to a name (``model``), held in a dict or list (``models['G']``,
``nets[0]``) or be an attribute of an object (``trainer.model``). Snapshots, state
replication and recovery find torch objects this way. The walk is breadth first (the shortest
path of an object wins), bounded in depth and size, and never descends into torch objects,
tensors, modules, classes or functions.
"""
from __future__ import annotations

import types
from typing import Any, Dict, Iterator, List, Tuple

#: How deep below a name the walk goes (``a['b'].c[0]`` is depth 3).
MAX_DEPTH = 3
#: Items looked at per dict, list or object, and objects looked at in all.
MAX_ITEMS = 64
MAX_NODES = 5000

#: Properties read as children (not in the object's ``__dict__``), by the defining class's module and name:
#: a Lightning Trainer keeps its module, optimizers and schedulers in its strategy's private fields.
PROPERTIES: Dict[str, Tuple[str, ...]] = {
    "lightning.pytorch.trainer.trainer.Trainer": ("lightning_module", "optimizers", "lr_scheduler_configs"),
}

_LEAF_TYPES = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType,
               int, float, str, bytes, bool, type(None), complex, range, memoryview)
_LEAF_MODULES = ("torch", "numpy", "pandas", "pyarrow", "ray", "builtins", "threading", "_thread", "io",
                 "socket", "multiprocessing", "concurrent", "asyncio", "IPython", "ipywidgets", "logging",
                 "tensorflow", "tf_keras", "keras")


def _is_leaf(obj: Any) -> bool:
    if isinstance(obj, _LEAF_TYPES):
        return True
    module = type(obj).__module__ or ""
    return module.split(".", 1)[0] in _LEAF_MODULES and not isinstance(obj, (dict, list, tuple))


def _children(obj: Any, path: str) -> List[Tuple[str, Any]]:
    if isinstance(obj, dict):
        items = [(k, v) for k, v in list(obj.items())[:MAX_ITEMS] if isinstance(k, (str, int))]
        return [(f"{path}[{k!r}]", v) for k, v in items]
    if isinstance(obj, (list, tuple)):
        return [(f"{path}[{i}]", v) for i, v in enumerate(obj[:MAX_ITEMS])]
    attrs = getattr(obj, "__dict__", None)
    if not isinstance(attrs, dict):
        return []
    return _properties(obj, path) + [(f"{path}.{k}", v) for k, v in list(attrs.items())[:MAX_ITEMS]
                                     if isinstance(k, str) and not k.startswith("_")]


def _properties(obj: Any, path: str) -> List[Tuple[str, Any]]:
    """The :data:`PROPERTIES` of ``obj``'s class (or a base class) that it can give now."""
    out: List[Tuple[str, Any]] = []
    for klass in type(obj).__mro__:
        for name in PROPERTIES.get(f"{klass.__module__}.{klass.__qualname__}", ()):
            try:
                out.append((f"{path}.{name}", getattr(obj, name)))
            except Exception:  # noqa: BLE001 - a property that cannot answer yet (no fit so far) has no child
                continue
    return out


def walk(namespace: Dict[str, Any], is_target: Any = None) -> Iterator[Tuple[str, Any]]:
    """Yield ``(path, obj)`` for every object reachable from the public names, once each.

    ``is_target(obj)`` marks objects the walk yields but does not descend into (torch modules,
    optimizers...); torch, numpy, Ray and standard-library objects are never descended into.
    """
    seen = set()
    level = [(name, namespace[name]) for name in sorted(namespace) if not name.startswith("_")]
    nodes = 0
    for depth in range(MAX_DEPTH + 1):
        following: List[Tuple[str, Any]] = []
        for path, obj in level:
            if id(obj) in seen or nodes >= MAX_NODES:
                continue
            seen.add(id(obj))
            nodes += 1
            yield path, obj
            if depth < MAX_DEPTH and not (is_target is not None and is_target(obj)) and not _is_leaf(obj):
                following.extend(_children(obj, path))
        level = following


def resolver(namespace: Dict[str, Any], is_target: Any = None) -> Dict[str, Any]:
    """Path -> object for every object :func:`walk` finds."""
    return dict(walk(namespace, is_target))


def top_name(path: str) -> str:
    """The name a path starts from: ``models['G'].fc`` -> ``models``."""
    for i, ch in enumerate(path):
        if ch in ".[":
            return path[:i]
    return path
