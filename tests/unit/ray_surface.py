"""Describes the public surface of Ray Train's modules and of ours at the same places, as JSON, in a process of its own.

``python tests/unit/ray_surface.py`` prints one JSON object: for each Ray Train module of ``PAIRS`` and for our module
at the same place, every public name with what it is, its signature (parameter names, kinds and defaults: annotations
are left out) and, for a class, the members that Ray's own classes define (methods, properties, class attributes).
``tests/unit/test_ray_parity.py`` compares the two sides.

With ``--stub``, the heavy libraries both sides import at module level (TensorFlow, Lightning, Transformers, XGBoost,
LightGBM) are replaced by stand-ins before anything is imported, so the description takes seconds, not the minute
those imports take together. What is compared does not depend on them: a name a module exports, a signature written
in Ray's or our code, a member a Ray class defines. A module that cannot be imported over the stand-ins is reported
as such, and the test describes it again with the real libraries.
"""
from __future__ import annotations

import dataclasses
import enum
import functools
import importlib
import importlib.abc
import importlib.machinery
import importlib.metadata
import inspect
import json
import sys
import types
from typing import Any, Dict, List, Optional, Tuple

#: Ray Train's public modules and ours at the same place.
PAIRS: List[Tuple[str, str]] = [
    ("ray.train", "raytrain_nb"),
    ("ray.train.torch", "raytrain_nb.torch"),
    ("ray.train.collective", "raytrain_nb.collective"),
    ("ray.train.xgboost", "raytrain_nb.xgboost"),
    ("ray.train.lightgbm", "raytrain_nb.lightgbm"),
    ("ray.train.lightning", "raytrain_nb.lightning"),
    ("ray.train.huggingface.transformers", "raytrain_nb.huggingface.transformers"),
    ("ray.train.tensorflow", "raytrain_nb.tensorflow"),
    ("ray.train.tensorflow.keras", "raytrain_nb.tensorflow.keras"),
]

#: Public classes that no ``__all__`` lists, compared as well: (Ray's module, name, our module).
EXTRA: List[Tuple[str, str, str]] = [
    ("ray.train.v2.api.data_parallel_trainer", "DataParallelTrainer", "raytrain_nb"),
]

#: Libraries replaced by stand-ins under ``--stub`` (top-level import names).
STUBBED = ("tensorflow", "tf_keras", "keras", "lightning", "pytorch_lightning", "lightning_fabric", "transformers",
           "xgboost", "lightgbm")

#: Ray's marker default of an argument Ray Train V2 deprecated (passing any value raises there).
DEPRECATED = "DEPRECATED"


# -- stand-ins for heavy libraries --------------------------------------------------------------------------------

class _StubMeta(type):
    """A stand-in class: every attribute is another stand-in class."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        sub = _StubMeta(name, (_Stub,), {"__module__": cls.__module__, "__qualname__": f"{cls.__qualname__}.{name}"})
        setattr(cls, name, sub)
        return sub


class _Stub(metaclass=_StubMeta):
    """The base of every stand-in class (constructor: ``(*args, **kwargs)``, which says nothing)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(type(self), name)


class _StubModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        value = _StubMeta(name, (_Stub,), {"__module__": self.__name__, "__qualname__": name})
        setattr(self, name, value)
        return value


def _version(top: str) -> str:
    for dist in importlib.metadata.packages_distributions().get(top, []):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "0"


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, fullname: str, path: Any = None,
                  target: Any = None) -> Optional[importlib.machinery.ModuleSpec]:
        if fullname.split(".")[0] not in STUBBED:
            return None
        return importlib.machinery.ModuleSpec(fullname, self, is_package=True)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        module = _StubModule(spec.name)
        module.__path__ = []
        module.__version__ = _version(spec.name.split(".")[0])
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        pass


def install_stubs() -> None:
    """Replace the libraries of ``STUBBED`` by stand-ins in this process (before anything imports them)."""
    sys.meta_path.insert(0, _StubFinder())


# -- the description ----------------------------------------------------------------------------------------------

def _default(value: Any) -> Any:
    """A parameter's default as something both sides can be compared by."""
    if value is inspect.Parameter.empty:
        return None
    if isinstance(value, enum.Enum):
        return f"{type(value).__name__}.{value.name}"
    if isinstance(value, (str, int, float, bool, type(None))):
        return repr(value)
    if isinstance(value, (tuple, list, dict, frozenset, set)):
        return repr(value)
    return f"<{type(value).__name__}>"


def signature(obj: Any) -> Optional[List[List[Any]]]:
    """``[[name, kind, has_default, default], ...]``, or None where Python cannot tell the signature."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):
        return None
    return [[p.name, p.kind.name, p.default is not inspect.Parameter.empty, _default(p.default)]
            for p in sig.parameters.values()]


def _owned_by_ray(cls: type) -> bool:
    return (getattr(cls, "__module__", "") or "").split(".")[0] == "ray"


def members(cls: type, ray_side: bool) -> Dict[str, Any]:
    """The public members of ``cls`` (on Ray's side: those Ray's own classes define; on ours, its dataclass fields
    too)."""
    out: Dict[str, Any] = {}
    if not ray_side and dataclasses.is_dataclass(cls):
        out.update({f.name: {"kind": "attribute"} for f in dataclasses.fields(cls) if not f.name.startswith("_")})
    for klass in reversed(cls.__mro__):
        if klass is object or (ray_side and not _owned_by_ray(klass)):
            continue
        for name, raw in vars(klass).items():
            if name.startswith("_"):
                continue
            out[name] = _member(cls, name, raw)
    return out


def _member(cls: type, name: str, raw: Any) -> Dict[str, Any]:
    if isinstance(raw, (property, functools.cached_property)):
        return {"kind": "property"}
    if isinstance(raw, classmethod):
        return {"kind": "classmethod", "signature": signature(getattr(cls, name))}
    if isinstance(raw, staticmethod):
        return {"kind": "staticmethod", "signature": signature(getattr(cls, name))}
    if inspect.isfunction(raw) or inspect.ismethoddescriptor(raw):
        return {"kind": "method", "signature": signature(raw)}
    if isinstance(raw, enum.Enum):
        return {"kind": "member", "value": repr(raw.value)}
    return {"kind": "attribute"}


def describe_object(obj: Any, ray_side: bool) -> Dict[str, Any]:
    if isinstance(obj, type):
        entry: Dict[str, Any] = {"kind": "enum" if issubclass(obj, enum.Enum) else "class",
                                 "signature": signature(obj), "members": members(obj, ray_side),
                                 "exception": issubclass(obj, BaseException),
                                 "library_base": any(isinstance(k, _StubMeta) for k in obj.__mro__)}
        if issubclass(obj, enum.Enum):
            entry["values"] = {m.name: repr(m.value) for m in obj}
        return entry
    if callable(obj):
        return {"kind": "function", "signature": signature(obj)}
    if isinstance(obj, types.ModuleType):
        return {"kind": "module"}
    return {"kind": "value", "value": repr(obj)}


def public_names(module: types.ModuleType) -> List[str]:
    """``__all__``, or (for a module without one) the classes and functions of Ray Train it holds."""
    names = getattr(module, "__all__", None)
    if names is not None:
        return list(names)
    return sorted(n for n, v in vars(module).items() if not n.startswith("_") and (inspect.isclass(v) or
                  inspect.isfunction(v)) and (getattr(v, "__module__", "") or "").startswith("ray.train"))


def describe_module(name: str, names: Optional[List[str]], ray_side: bool) -> Dict[str, Any]:
    """``{"names": {name: description}}``; ``{"error": ...}`` when the module does not import."""
    try:
        module = importlib.import_module(name)
    except Exception as exc:  # noqa: BLE001 - the test names what failed
        return {"error": f"{type(exc).__name__}: {exc}"}
    out: Dict[str, Any] = {}
    for attr in (public_names(module) if names is None else names):
        try:
            value = getattr(module, attr)
        except AttributeError:
            out[attr] = {"kind": "missing"}
            continue
        except Exception as exc:  # noqa: BLE001 - a lazy name that fails to load is reported, not hidden
            out[attr] = {"kind": "error", "error": f"{type(exc).__name__}: {exc}"}
            continue
        out[attr] = describe_object(value, ray_side)
    return {"names": out}


def describe(pairs: List[Tuple[str, str]]) -> Dict[str, Any]:
    """Ray's side and ours for every pair, plus the ``EXTRA`` classes."""
    result: Dict[str, Any] = {"ray_version": None, "pairs": {}}
    from raytrain_nb._internal.lean_entry import defer_iri_grammar  # before Ray's first import here

    defer_iri_grammar()  # a second less: jsonschema's IRI grammar waits for a check this process never makes
    for ray_name, our_name in pairs:
        ray_side = describe_module(ray_name, None, ray_side=True)
        ours = describe_module(our_name, list(ray_side.get("names", {})), ray_side=False)
        result["pairs"][ray_name] = {"ours": our_name, "ray": ray_side, "our": ours}
    for ray_module, name, our_module in EXTRA:
        ray_side = describe_module(ray_module, [name], ray_side=True)
        ours = describe_module(our_module, [name], ray_side=False)
        result["pairs"][f"{ray_module}.{name}"] = {"ours": our_module, "ray": ray_side, "our": ours}
    import ray

    result["ray_version"] = ray.__version__
    return result


def main(argv: List[str]) -> None:
    stub = "--stub" in argv
    only = [a for a in argv if not a.startswith("--")]
    if stub:
        install_stubs()
    pairs = [p for p in PAIRS if not only or p[0] in only]
    json.dump(describe(pairs), sys.stdout)


if __name__ == "__main__":
    main(sys.argv[1:])
