"""Digests of training state, the same on the workers and on the soak driver.

This file is self-contained (stdlib and torch only, every name prefixed ``soak_``) because it is
used three ways: imported by the soak to verify checkpoint files, sent as the source of a setup
cell so training cells can call ``soak_note`` / ``soak_state`` on the workers, and pickled by
value (``soak_remote_digests``) for ``WorkerGroup.execute`` to compare the ranks.

A *path* names where an object was found: ``model``, ``nets['g']``, ``box.opt``. Modules are
digested unwrapped (a DDP wrapper counts as its module), optimizers and schedulers by their
``state_dict()``.
"""
import gc
import hashlib
import json
import os
import sys
from typing import Any, Dict, Optional

#: Where rank 0 appends its notes (set by the setup cell that defines these functions).
SOAK_LEDGER = ""
#: Digests of big tensors that did not change (keyed by address and version; the tensor is kept, so
#: its memory cannot be reused by another tensor while cached).
SOAK_BIG_CACHE: Dict[Any, Any] = {}
SOAK_BIG = 1 << 20


def soak_canon(obj: Any, h: Any) -> None:
    """Feed a canonical encoding of a state dict (nested dicts, lists, tensors, numbers) to ``h``."""
    import torch

    if isinstance(obj, torch.Tensor):
        t = obj.detach()
        key = None
        if t.numel() >= SOAK_BIG:
            key = (t.data_ptr(), t._version, tuple(t.shape), tuple(t.stride()), str(t.dtype))
            cached = SOAK_BIG_CACHE.get(key)
            if cached is not None:
                h.update(cached[1])
                return
        flat = t.to("cpu").contiguous().reshape(-1)
        sub = hashlib.sha1(f"T{t.dtype}{tuple(t.shape)}".encode())
        sub.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        out = sub.digest()
        if key is not None:
            if len(SOAK_BIG_CACHE) >= 4:
                SOAK_BIG_CACHE.clear()
            SOAK_BIG_CACHE[key] = (obj, out)
        h.update(out)
    elif isinstance(obj, dict):
        h.update(b"{")
        for k in sorted(obj, key=repr):
            h.update(repr(k).encode() + b":")
            soak_canon(obj[k], h)
        h.update(b"}")
    elif isinstance(obj, (list, tuple)):
        h.update(b"[")
        for v in obj:
            soak_canon(v, h)
        h.update(b"]")
    elif isinstance(obj, float):
        h.update(repr(float(obj)).encode())
    else:
        h.update(repr(obj).encode())


def soak_digest(state: Any) -> str:
    """A short hex digest of a state dict."""
    h = hashlib.sha1()
    soak_canon(state, h)
    return h.hexdigest()[:16]


def soak_kind(obj: Any) -> Optional[str]:
    """``module``/``optimizer``/``scheduler``/``scaler`` for training state, else None."""
    import torch

    if isinstance(obj, torch.nn.Module):
        return "module"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizer"
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        return "scheduler"
    if type(obj).__name__ == "GradScaler" and hasattr(obj, "state_dict"):
        return "scaler"
    return None


def soak_unwrap(module: Any) -> Any:
    return getattr(module, "module", module) if type(module).__name__ in (
        "DistributedDataParallel", "DataParallel") else module


def soak_find(ns: Dict[str, Any], depth: int = 2) -> Dict[str, Any]:
    """Every piece of training state reachable from the namespace: path -> object.

    Looks at names (not ``_``-prefixed), then into dicts, lists, tuples and plain objects'
    attributes, ``depth`` levels deep. A module reached twice is kept under its first path.
    """
    found: Dict[str, Any] = {}
    seen = set()

    def visit(path: str, obj: Any, left: int) -> None:
        kind = soak_kind(obj)
        if kind is not None:
            inner = soak_unwrap(obj) if kind == "module" else obj
            if id(inner) not in seen:
                seen.add(id(inner))
                found[path] = inner
            return
        if left <= 0 or isinstance(obj, (str, bytes, int, float, type)) or callable(obj):
            return
        if isinstance(obj, dict):
            for k in sorted(obj, key=repr)[:50]:
                visit(f"{path}[{k!r}]", obj[k], left - 1)
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj[:50]):
                visit(f"{path}[{i}]", v, left - 1)
        elif hasattr(obj, "__dict__") and type(obj).__module__ in ("__main__", "builtins"):
            for k in sorted(vars(obj))[:50]:
                if not k.startswith("_"):
                    visit(f"{path}.{k}", getattr(obj, k), left - 1)

    for name in sorted(ns):
        if not name.startswith(("_", "soak_", "SOAK_")) and name not in ("In", "Out"):
            visit(name, ns[name], depth)
    return found


def soak_digests(ns: Dict[str, Any]) -> Dict[str, str]:
    """path -> digest of every piece of training state in the namespace."""
    return {path: soak_digest(obj.state_dict()) for path, obj in soak_find(ns).items()}


#: Left out of reported checkpoints: the big untrained module (it only makes snapshots slow).
SOAK_NOT_REPORTED = ("ballast",)


def soak_state(ns: Dict[str, Any]) -> Dict[str, Any]:
    """path -> CPU copy of the state dict, for a reported checkpoint's ``state.pt`` (all but the ballast)."""
    import torch

    def cpu(o: Any) -> Any:
        if isinstance(o, torch.Tensor):
            return o.detach().to("cpu").clone()
        if isinstance(o, dict):
            return {k: cpu(v) for k, v in o.items()}
        if isinstance(o, (list, tuple)):
            return type(o)(cpu(v) for v in o)
        return o

    return {path: cpu(obj.state_dict()) for path, obj in soak_find(ns).items() if path not in SOAK_NOT_REPORTED}


def soak_note(kind: str, tag: str, step: Any, ns: Dict[str, Any]) -> Dict[str, str]:
    """Append what the state is now to the soak's ledger (rank 0 calls it before each report)."""
    digests = soak_digests(ns)
    if SOAK_LEDGER:
        line = json.dumps({"kind": kind, "tag": tag, "step": step, "digests": digests})
        with open(SOAK_LEDGER, "a") as fh:
            fh.write(line + "\n")
            fh.flush()
            os.fsync(fh.fileno())
    return digests


def soak_namespace() -> Dict[str, Any]:
    """The worker's user namespace (found once through the garbage collector, then cached on ``sys``)."""
    cached = getattr(sys, "_soak_namespace", None)
    if cached is not None:
        return cached
    for obj in gc.get_objects():
        ns = getattr(obj, "namespace", None) if type(obj).__name__ == "Worker" else None
        if isinstance(ns, dict) and "__builtins__" in ns:
            sys._soak_namespace = ns  # type: ignore[attr-defined]
            return ns
    raise RuntimeError("soak: no worker namespace found in this process")


def soak_remote_digests() -> Dict[str, str]:
    """For ``group.execute``: this rank's digests."""
    return soak_digests(soak_namespace())
