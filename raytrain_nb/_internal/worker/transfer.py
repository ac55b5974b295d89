"""Copying a live peer's objects to a new rank: what replaying setup cells could not rebuild.

A model built in a cell that also trained it, rebuilt later under the same name, or made by a
function called from a training cell exists on the live ranks only. The source rank pickles the
names a new rank lacks (or holds with another structure) in one pickle, so shared references stay
shared (an optimizer's parameters are its model's). Objects the new rank already has travel as
references to its own (its replayed model's parameters, its functions and classes, its dataset
shard); a DDP wrapper, which cannot be pickled, travels as its inner module and is wrapped again
when the process group forms. Functions and classes defined in cells are pickled by value
(cloudpickle); a function's globals are pointed back at the namespace it lands in.
"""
from __future__ import annotations

import io
import pickle
import sys
import types
from typing import Any, Dict, Iterable, List, Tuple

from .snapshot import is_tracked_type
from .walk import walk

Token = Tuple[Any, ...]


def _is_ddp(obj: Any) -> bool:
    return type(obj).__name__ in ("DistributedDataParallel", "DataParallel") and hasattr(obj, "module")


#: Values equal by value: never sent as a reference (``3`` in a payload is not the peer's ``epoch``).
_BY_VALUE = (int, float, complex, str, bytes, bool, type(None), tuple, frozenset, range)


def _shared(names: Iterable[str], namespace: Dict[str, Any]) -> Iterable[Tuple[str, Any]]:
    """What both sides walk to name references: the same names, in the same order."""
    return walk({n: namespace[n] for n in sorted(names)}, is_tracked_type)


def reference_tokens(namespace: Dict[str, Any], names: Iterable[str], shards: Dict[str, Any]) -> Dict[int, Token]:
    """id -> token for the objects a new rank has of its own: ``names`` (bound on every rank with the
    same structure), the objects below them and tracked objects' parameters, and the dataset shards."""
    torch = sys.modules.get("torch")  # not imported: no object is a torch module
    tokens: Dict[int, Token] = {}
    for path, obj in _shared(names, namespace):
        if isinstance(obj, _BY_VALUE):
            continue
        tokens.setdefault(id(obj), ("path", path))
        if torch is not None and isinstance(obj, torch.nn.Module):
            inner = obj.module if _is_ddp(obj) else obj
            tokens.setdefault(id(inner), ("inner", path))
            for key, tensor in [*inner.named_parameters(), *inner.named_buffers()]:
                tokens.setdefault(id(tensor), ("tensor", path, key))
    for name, shard in shards.items():
        tokens[id(shard)] = ("shard", name)
    return tokens


def _dump(obj: Any, tokens: Dict[int, Token]) -> bytes:
    import cloudpickle  # cloudpickle: comes with Ray, loaded when a group recovers

    class _Pickler(cloudpickle.CloudPickler):
        """cloudpickle (functions and classes by value) with our references."""

        def persistent_id(self, o: Any) -> Any:
            token = tokens.get(id(o))
            if token is not None:
                return token
            if _is_ddp(o):
                return ("ddp", o.module, dict(getattr(o, "_rtnb_ddp_kwargs", {}) or {}))
            return None

    buf = io.BytesIO()
    _Pickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def pack(namespace: Dict[str, Any], names: List[str], tokens: Dict[int, Token]) -> Tuple[bytes, Dict[str, str]]:
    """Pickle ``names`` of ``namespace`` together. Returns ``(payload, problems)``: ``problems`` maps each
    name that cannot be pickled to why (then the payload is empty)."""
    try:
        return _dump({n: namespace[n] for n in names}, tokens), {}
    except Exception as together:  # noqa: BLE001 - find which names, one by one
        problems: Dict[str, str] = {}
        for name in names:
            try:
                _dump({name: namespace[name]}, tokens)
            except Exception as exc:  # noqa: BLE001 - named in the error
                problems[name] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        return b"", problems or {", ".join(names): f"{type(together).__name__}: {together}"}


def unpack(payload: bytes, namespace: Dict[str, Any], names: Iterable[str], shards: Dict[str, Any],
           deferred_ddp: Any) -> Dict[str, Any]:
    """Load what :func:`pack` made into objects of this rank; ``names`` are those given to
    :func:`reference_tokens` on the source. ``deferred_ddp(module, kwargs)`` makes a DDP wrapper to be
    bound when the process group forms.

    Raises:
        KeyError: a reference names an object this rank does not have.
    """
    found = dict(_shared(names, namespace))

    def resolve(token: Token) -> Any:
        kind = token[0]
        if kind in ("path", "inner", "tensor") and token[1] not in found:
            raise KeyError(f"{token[1]} is not bound on this rank")
        if kind == "path":
            return found[token[1]]
        if kind in ("inner", "tensor"):
            module = found[token[1]]
            module = module.module if _is_ddp(module) else module
            if kind == "inner":
                return module
            return dict([*module.named_parameters(), *module.named_buffers()])[token[2]]
        if kind == "shard":
            return shards[token[1]]
        if kind == "ddp":
            return deferred_ddp(token[1], token[2])
        raise pickle.UnpicklingError(f"unknown reference {kind!r}")

    class _Unpickler(pickle.Unpickler):
        def persistent_load(self, pid: Any) -> Any:
            return resolve(tuple(pid))

    loaded = _Unpickler(io.BytesIO(payload)).load()
    for name, value in loaded.items():  # a function defined in a cell reads the namespace it lives in
        if isinstance(value, types.FunctionType) and value.__module__ == namespace.get("__name__") \
                and value.__globals__ is not namespace:
            fn = types.FunctionType(value.__code__, namespace, value.__name__, value.__defaults__, value.__closure__)
            fn.__kwdefaults__, fn.__dict__ = value.__kwdefaults__, dict(value.__dict__)
            fn.__qualname__, fn.__doc__ = value.__qualname__, value.__doc__
            loaded[name] = fn
    return loaded
