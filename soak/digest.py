"""Digests of training state, the same on the workers and on the soak driver.

This file is self-contained (stdlib and torch only, every name prefixed ``soak_``) because it is
used three ways: imported by the soak to verify checkpoint files, sent as the source of a setup
cell so training cells can call ``soak_note`` / ``soak_state`` on the workers, and pickled by
value (``soak_remote_digests``) for ``WorkerGroup.execute`` to compare the ranks.

A *path* names where an object was found: ``model``, ``nets['g']``, ``box.opt``. Modules are
digested unwrapped (a DDP wrapper counts as its module), optimizers and schedulers by their
``state_dict()``.

A sharded (FSDP2) model's parameters and its optimizer's moments are ``DTensor`` shards, different on every rank,
so it is digested as its full state, whichever way that is reached: gathered with ``full_tensor()`` inside a cell
every rank runs (``soak_note``/``soak_state`` with ``gather``, before a report), joined by the soak from every
rank's local shard (``soak_parts`` then ``soak_merge``: no collective, so a check between steps never waits on a
rank; it also checks each rank holds exactly the rows FSDP2 gives it), or gathered by DCP from a snapshot's
``sharded/`` folder (:mod:`soak.ledger`). Its optimizer is keyed by parameter names as DCP keys it, so all three
give the same digest.
"""
import gc
import hashlib
import json
import os
import sys
from typing import Any, Dict, List, Optional

#: Where rank 0 appends its notes (set by the setup cell that defines these functions).
SOAK_LEDGER = ""
#: Digests of big tensors that did not change (keyed by address and version; the tensor is kept, so
#: its memory cannot be reused by another tensor while cached).
SOAK_BIG_CACHE: Dict[Any, Any] = {}
SOAK_BIG = 1 << 20


#: A leaf already hashed (``{SOAK_HASHED: hex}``): what :func:`soak_merge` puts where the full tensor would be.
SOAK_HASHED = "__soak_hashed__"
#: A leaf of one rank's local shard of a ``DTensor`` (see :func:`soak_split`).
SOAK_SHARD = "__soak_shard__"


def soak_is_dtensor(t: Any) -> bool:
    """Whether ``t`` is a ``DTensor`` (a sharded model's parameter or optimizer state), without importing it."""
    return type(t).__name__ == "DTensor" and hasattr(t, "to_local")


def soak_canon(obj: Any, h: Any) -> None:
    """Feed a canonical encoding of a state dict (nested dicts, lists, tensors, numbers) to ``h``."""
    torch = sys.modules.get("torch")  # not imported here: without torch loaded nothing is a tensor (the kernel)

    if isinstance(obj, dict) and SOAK_HASHED in obj:
        h.update(bytes.fromhex(obj[SOAK_HASHED]))
        return
    if soak_is_dtensor(obj):  # reshaping one would redistribute it (a collective): gather or split it first
        raise TypeError("soak: a sharded tensor must be gathered (soak_gather) or split (soak_split) first")
    if torch is not None and isinstance(obj, torch.Tensor):
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


def soak_fqns(found: Dict[str, Any]) -> Dict[int, str]:
    """id(parameter) -> its name in its sharded module, for every sharded module found (FQNs, as DCP keys them)."""
    out: Dict[int, str] = {}
    for obj in found.values():
        if hasattr(obj, "named_parameters"):
            named = list(obj.named_parameters())
            if any(soak_is_dtensor(p) for _, p in named):
                for name, p in named:
                    out.setdefault(id(p), name)
    return out


def soak_canonical(obj: Any, fqns: Dict[int, str]) -> Any:
    """The state dict the soak digests: ``obj.state_dict()``; for an optimizer of a sharded model, keyed by its
    parameters' names as ``get_optimizer_state_dict`` keys it (what a sharded snapshot holds)."""
    sd = obj.state_dict()
    groups = getattr(obj, "param_groups", None)
    if not groups or not any(soak_is_dtensor(p) for g in groups for p in g["params"]):
        return sd
    names = [fqns.get(id(p), str(i)) for i, p in enumerate(p for g in groups for p in g["params"])]
    return {"state": {names[i]: v for i, v in sd["state"].items()},
            "param_groups": [dict({k: v for k, v in g.items() if k != "params"}, params=[names[i] for i in g["params"]])
                             for g in sd["param_groups"]]}


def soak_map(obj: Any, fn: Any) -> Any:
    """``obj`` (nested dicts, lists, tuples) with every tensor ``t`` replaced by ``fn(t)``."""
    import torch

    if isinstance(obj, torch.Tensor):
        return fn(obj)
    if isinstance(obj, dict):
        return {k: soak_map(v, fn) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(soak_map(v, fn) for v in obj)
    return obj


def soak_has_dtensor(obj: Any) -> bool:
    """Whether a (nested) state dict holds a ``DTensor``."""
    if isinstance(obj, dict):
        return any(soak_has_dtensor(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return any(soak_has_dtensor(v) for v in obj)
    return soak_is_dtensor(obj)


def soak_gather(t: Any) -> Any:
    """A ``DTensor``'s full tensor (an all-gather: every rank calls it, in the same order), else ``t``."""
    return t.full_tensor() if soak_is_dtensor(t) else t


def soak_split(t: Any) -> Dict[str, Any]:
    """One rank's part of a leaf of a sharded state dict, with no collective and no torch object in it: a
    ``DTensor``'s local shard (its bytes, the global shape, the mesh and this rank's place in it); a plain tensor
    pre-hashed (it must be the same on every rank)."""
    import torch

    if not soak_is_dtensor(t):
        flat = t.detach().to("cpu").contiguous().reshape(-1)
        sub = hashlib.sha1(f"T{t.dtype}{tuple(t.shape)}".encode())
        sub.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        return {SOAK_HASHED: sub.hexdigest()}
    local = t.to_local().detach().to("cpu").contiguous()
    flat = local.reshape(-1)
    mesh = t.device_mesh
    return {SOAK_SHARD: 1, "dtype": str(t.dtype), "shape": list(t.shape), "local_shape": list(local.shape),
            "mesh": [int(mesh.size()), mesh.ndim], "coord": int(mesh.get_local_rank()),
            "placements": [f"{type(p).__name__}({getattr(p, 'dim', '')})" for p in t.placements],
            "bytes": flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b""}


def soak_digests(ns: Dict[str, Any], gather: bool = False) -> Dict[str, str]:
    """path -> digest of every piece of training state in the namespace. A sharded model's state is digested as
    its full tensors: with ``gather`` every rank must call this at the same point (all-gathers); without, a
    ``DTensor`` raises (use :func:`soak_remote_digests` and :func:`soak_merge`)."""
    found = soak_find(ns)
    fqns = soak_fqns(found)
    out = {}
    for path, obj in found.items():
        state = soak_canonical(obj, fqns)
        out[path] = soak_digest(soak_map(state, soak_gather) if gather else state)
    return out


#: Left out of reported checkpoints: the big untrained module (it only makes snapshots slow).
SOAK_NOT_REPORTED = ("ballast",)


def soak_state(ns: Dict[str, Any], gather: bool = False) -> Dict[str, Any]:
    """path -> CPU copy of the (canonical) state dict, for a reported checkpoint's ``state.pt`` (all but the
    ballast); with ``gather`` a sharded model's full tensors (every rank calls it at the same point)."""
    def cpu(t: Any) -> Any:
        return (soak_gather(t) if gather else t).detach().to("cpu").clone()

    found = soak_find(ns)
    fqns = soak_fqns(found)
    return {path: soak_map(soak_canonical(obj, fqns), cpu) for path, obj in found.items()
            if path not in SOAK_NOT_REPORTED}


def soak_note(kind: str, tag: str, step: Any, ns: Dict[str, Any], gather: bool = False,
              write: bool = True) -> Dict[str, str]:
    """Append what the state is now to the soak's ledger (rank 0 calls it before each report; with a sharded
    model every rank calls it with ``gather`` and only rank 0 ``write``s)."""
    digests = soak_digests(ns, gather)
    if SOAK_LEDGER and write:
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


def soak_remote_digests() -> Dict[str, Any]:
    """For ``group.execute``: :func:`soak_parts` of this worker's namespace."""
    return soak_parts(soak_namespace())


def soak_parts(ns: Dict[str, Any]) -> Dict[str, Any]:
    """This rank's digests, each rank alone (no collective); a sharded model's or optimizer's state as
    ``{SOAK_SHARD: its leaves split}`` (:func:`soak_split`), for :func:`soak_merge`."""
    found = soak_find(ns)
    fqns = soak_fqns(found)
    out: Dict[str, Any] = {}
    for path, obj in found.items():
        state = soak_canonical(obj, fqns)
        out[path] = {SOAK_SHARD: soak_map(state, soak_split)} if soak_has_dtensor(state) else soak_digest(state)
    return out


def soak_shard_problem(part: Dict[str, Any], first: Dict[str, Any], world: int, rank: int) -> str:
    """Why rank ``rank``'s shard ``part`` is not the one FSDP2 gives it on a 1-D mesh of every rank ("" if it is):
    the same global shape, dtype and placement ``Shard(0)`` as rank 0's, place ``rank`` in a mesh of ``world``,
    and rows ``[rank * c, (rank + 1) * c)`` of the full tensor (``c`` rounded up, as ``torch.chunk``)."""
    shape = first["shape"]
    chunk = -(-shape[0] // world) if shape else 0
    rows = max(0, min(shape[0], (rank + 1) * chunk) - rank * chunk) if shape else 0
    if (part["shape"], part["dtype"]) != (shape, first["dtype"]):
        return f"its global shape or dtype {part['shape']} {part['dtype']} differs from rank 0's"
    if part["mesh"] != [world, 1] or part["coord"] != rank:
        return f"it is number {part['coord']} of a mesh of {part['mesh']} (size, dims), not {rank} of {world} ranks"
    if part["placements"] != ["Shard(0)"]:
        return f"placements {part['placements']}, not [Shard(0)]"
    if part["local_shape"] != [rows] + shape[1:]:
        return f"its local shard is {part['local_shape']}, not {[rows] + shape[1:]}"
    return ""


def soak_join(nodes: List[Any], where: str, problems: List[str]) -> Any:
    """The ranks' parts of one place of a sharded state dict joined into one (a full tensor's leaf as its digest),
    or None with a line in ``problems`` where the ranks' parts do not fit together."""
    first, world = nodes[0], len(nodes)
    if isinstance(first, dict) and SOAK_SHARD in first:
        if not all(isinstance(n, dict) and SOAK_SHARD in n for n in nodes):
            problems.append(f"{where}: a DTensor on some ranks only")
            return None
        for r, n in enumerate(nodes):
            why = soak_shard_problem(n, first, world, r)
            if why:
                problems.append(f"{where}: rank {r}: {why}")
                return None
        shape = first["shape"]
        h = hashlib.sha1(f"T{first['dtype']}{tuple(shape)}".encode())
        for n in nodes:  # Shard(0) of contiguous tensors: the full tensor's bytes are the shards' in mesh order
            h.update(n["bytes"])
        return {SOAK_HASHED: h.hexdigest()}
    if isinstance(first, dict) and SOAK_HASHED in first:
        if any(n != first for n in nodes):
            problems.append(f"{where}: a plain tensor differs across ranks")
        return first
    if isinstance(first, dict):
        if any(not isinstance(n, dict) or set(n) != set(first) for n in nodes):
            problems.append(f"{where}: the ranks' keys differ")
            return None
        return {k: soak_join([n[k] for n in nodes], f"{where}[{k!r}]", problems) for k in first}
    if isinstance(first, (list, tuple)):
        if any(not isinstance(n, (list, tuple)) or len(n) != len(first) for n in nodes):
            problems.append(f"{where}: the ranks' lengths differ")
            return None
        return [soak_join([n[i] for n in nodes], f"{where}[{i}]", problems) for i in range(len(first))]
    if any(repr(n) != repr(first) for n in nodes):
        problems.append(f"{where}: {first!r} on rank 0, not on every rank")
    return first


def soak_merge(per_rank: List[Dict[str, Any]]) -> List[Dict[str, str]]:
    """Each rank's digests (from :func:`soak_remote_digests`), a sharded path's as the digest of its full state,
    joined from every rank's shards (what ``full_tensor()`` would gather, with no collective): the same on every
    rank when the shards fit together; where they do not, ``"!<why>"``, different on each rank."""
    out = [dict(d) for d in per_rank]
    for path in sorted(set().union(*per_rank) if per_rank else ()):
        parts = [d.get(path) for d in per_rank]
        if not any(isinstance(p, dict) for p in parts):
            continue
        problems: List[str] = []
        if all(isinstance(p, dict) for p in parts):
            joined = soak_join([p[SOAK_SHARD] for p in parts], path, problems)
        else:
            problems.append(f"{path} is sharded on ranks {[r for r, p in enumerate(parts) if isinstance(p, dict)]} "
                            "only")
        for r, d in enumerate(out):
            if path in d:
                d[path] = f"!{problems[0]} [rank {r}]" if problems else soak_digest(joined)
    return out
