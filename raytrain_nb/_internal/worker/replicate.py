"""Bring every rank's replicated state in line with one rank's, after a process group (re)forms.

Used after an interrupt or a divergent error (ranks stopped at different points of a step), when
a replacement rank joins, and when the group is rescaled. Every step is agreed first: the ranks
exchange what they hold (an all-gather), and each then takes the same decisions from the same
data, so no rank enters a collective its peers skip. A new rank first receives from the source
rank every object replaying the setup cells did not give it (see :mod:`.transfer`); then models,
optimizers, schedulers and scalers are broadcast; then the DDP wrappers every rank holds at the
same path are re-bound, in one order.
"""
from __future__ import annotations

import hashlib
import logging
import pickle
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..backend import process_group_state
from ..errors import RecoveryError
from . import transfer
from .flat_broadcast import broadcast_tensors
from .sharded import class_name
from .snapshot import Tracked, find_tracked, fingerprint
from .walk import top_name

logger = logging.getLogger(__name__)


def _shapes(module: Any) -> List[Tuple[str, Tuple[int, ...], str]]:
    return [(k, tuple(v.shape), str(v.dtype)) for k, v in module.state_dict().items()]


def _structure(namespace: Dict[str, Any], tracked: Tracked) -> Dict[str, str]:
    """Top-level name -> digest of its type and of the tracked objects below it (their shapes)."""
    parts: Dict[str, List[str]] = {n: [class_name(v)] for n, v in namespace.items() if not n.startswith("_")}
    for path, module in tracked.modules.items():
        parts[top_name(path)].append(f"m {path} {type(module).__qualname__} {_shapes(module)}")
    for path in tracked.wrappers:
        parts[top_name(path)].append(f"w {path}")
    for path, opt in tracked.optimizers.items():
        shapes = [tuple(p.shape) for g in opt.param_groups for p in g["params"]]
        parts[top_name(path)].append(f"o {path} {type(opt).__qualname__} {shapes}")
    for kind, objs in (("s", tracked.schedulers), ("g", tracked.scalers)):
        for path, obj in objs.items():
            parts[top_name(path)].append(f"{kind} {path} {type(obj).__qualname__}")
    return {n: hashlib.sha1("\n".join(p).encode()).hexdigest()[:16] for n, p in parts.items()}


def inventory(namespace: Dict[str, Any], fresh: bool) -> Dict[str, Any]:
    """What this rank holds, as every rank tells the others before a transfer (:func:`plan_transfer`)."""
    return _inventory(namespace, fresh)[1]


def _inventory(namespace: Dict[str, Any], fresh: bool) -> Tuple[Tracked, Dict[str, Any]]:
    tracked = find_tracked(namespace, strict=False)  # an optimizer of an unnamed model: sync the rest
    return tracked, {
        "modules": {p: _shapes(m) for p, m in tracked.modules.items()},
        "wrappers": {p: _shapes(tracked.modules.get(p, w.module)) for p, w in tracked.wrappers.items()},
        "optimizers": sorted(tracked.optimizers),
        "schedulers": sorted(tracked.schedulers),
        "scalers": sorted(tracked.scalers),
        "plain": sorted(fingerprint(namespace)),
        "structure": _structure(namespace, tracked),
        "fresh": fresh,
    }


def _gather(mine: Any) -> List[Any]:
    import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

    everyone: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return everyone


def _gather_alike(mine: Any) -> List[Any]:
    """:func:`_gather`, in one small collective when every rank holds the same ``mine`` (the usual case when the
    same ranks re-form): each rank's SHA-256 of its pickled ``mine`` is gathered, and only when they differ are
    the objects themselves (two more collectives, and every rank's object unpickled on every rank)."""
    import torch  # torch: loaded on first use, not on import raytrain_nb
    import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

    digest = hashlib.sha256(pickle.dumps(mine, protocol=pickle.HIGHEST_PROTOCOL)).digest()
    device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
    own = torch.frombuffer(bytearray(digest), dtype=torch.uint8).to(device)
    digests = [torch.empty_like(own) for _ in range(dist.get_world_size())]
    dist.all_gather(digests, own)
    if all(torch.equal(d, own) for d in digests):
        return [mine] * len(digests)
    return _gather(mine)


def _agree(ok: bool, error: str) -> None:
    """Every rank learns whether every rank succeeded; all raise the first error if not."""
    errors = [e for e in _gather(None if ok else error) if e]
    if errors:
        raise RecoveryError(errors[0])


def plan_transfer(everyone: List[Dict[str, Any]], src: int,
                  rank_specific: Sequence[str]) -> Tuple[List[str], List[str], List[str]]:
    """What the fresh ranks need from rank ``src``: ``(send, keep, cannot)``.

    ``send``: names a fresh rank lacks or holds with another structure; ``keep``: names every fresh
    rank holds as ``src`` does (sent as references to their own); ``cannot``: plain variables a fresh
    rank lacks that differ across ranks (``rank``, a loss value...), so no peer's copy is right: the
    fresh rank goes without them (and the driver says so).
    """
    ref = everyone[src]["structure"]
    fresh = [e["structure"] for e in everyone if e["fresh"]]
    differ = sorted(n for n in ref if any(f.get(n) != ref[n] for f in fresh))
    skip = set(rank_specific)
    cannot = [n for n in differ if n in skip and any(n not in f for f in fresh)]
    send = [n for n in differ if n not in skip]
    keep = sorted(n for n in ref if n not in differ and all(n in f for f in fresh))
    return send, keep, cannot


def _transfer(namespace: Dict[str, Any], everyone: List[Dict[str, Any]], src: int, fresh: bool,
              rank_specific: Sequence[str], shards: Dict[str, Any],
              deferred_ddp: Callable[..., Any]) -> Tuple[List[str], List[str]]:
    import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

    send, keep, cannot = plan_transfer(everyone, src, rank_specific)
    if not send:
        return cannot, []
    box: List[Any] = [None]
    if dist.get_rank() == src:
        box = [transfer.pack(namespace, send, transfer.reference_tokens(namespace, keep, shards))]
    dist.broadcast_object_list(box, src=src)
    payload, problems = box[0]
    if problems:
        names = "; ".join(f"{n} ({why})" for n, why in sorted(problems.items()))
        raise RecoveryError(f"a new rank cannot get {names} from rank {src}: make them in a cell marked "
                            "--setup (%%distributed --setup), which new ranks replay")
    error = ""
    if fresh:
        try:
            received = transfer.unpack(payload, namespace, keep, shards, deferred_ddp)
            namespace.update(received)
            process_group_state().adopt_samplers(received.values())  # re-sharded for this rank on joining
        except Exception as exc:  # noqa: BLE001 - every rank raises it after the agreement below
            error = f"rank {dist.get_rank()} could not load {', '.join(send)} from rank {src}: " \
                    f"{type(exc).__name__}: {exc}"
    _agree(not error, error)
    return cannot, send


def sync_replicated(namespace: Dict[str, Any], src: int, fresh: bool, rank_specific: Sequence[str] = (),
                    shards: Optional[Dict[str, Any]] = None,
                    deferred_ddp: Optional[Callable[..., Any]] = None,
                    alike: bool = True) -> Tuple[List[Any], List[str], List[str]]:
    """Make every rank hold rank ``src``'s replicated state. ``alike``: the ranks may hold the same (they are
    first compared by a digest); False (told alike to every rank) when some rank is fresh, so they do not.

    Returns:
        The DDP wrappers to re-bind, in order; the names a fresh rank had to go without; the names it
        received from rank ``src``.

    A ``fresh`` rank (a replacement or a new rank) first receives what it lacks (see
    :func:`plan_transfer`) and rank ``src``'s plain variables (``step``, ``epoch``...), except the
    ``rank_specific`` ones (seen to differ across ranks). Then every module, optimizer, scheduler and
    scaler every rank holds at the same path (modules: with the same shapes) is broadcast.

    Raises:
        RecoveryError: on every rank alike, when a fresh rank cannot get an object, naming it.
    """
    import torch  # torch: loaded on first use, not on import raytrain_nb
    import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

    # A rank joins fresh (the driver says so to every rank alike): over gloo the source's optimizers, schedulers,
    # scalers and plain variables are pickled first, so their sizes travel in its inventory and their bytes in
    # the tensors' packed broadcast (not in two collectives more of their own).
    ahead = not alike and dist.get_backend() == "gloo"
    tracked, mine = _inventory(namespace, fresh)
    pieces = _pieces(namespace, tracked, mine["plain"], rank_specific) if ahead and dist.get_rank() == src else {}
    sizes = {key: len(blob) for key, blob in pieces.items()}
    mine["pieces"] = sizes
    everyone = _gather_alike(mine) if alike else _gather(mine)
    missing: List[str] = []
    received: List[str] = []
    if any(e["fresh"] for e in everyone):
        missing, received = _transfer(namespace, everyone, src, fresh, rank_specific, shards or {}, deferred_ddp)
        if received:  # what the fresh ranks hold changed (nothing sent: every inventory is as gathered)
            tracked, mine = _inventory(namespace, fresh)
            mine["pieces"] = sizes
            everyone = _gather(mine)
    ref = everyone[src]
    counts = {"modules": 0, "objects": 0, "variables": 0}
    tensors: List[Any] = []
    for path, shapes in sorted(ref["modules"].items()):
        if all(e["modules"].get(path) == shapes for e in everyone):
            tensors.extend(tracked.modules[path].state_dict().values())
            counts["modules"] += 1
        else:
            logger.warning("model %r differs across ranks; not synchronised", path)
    stateful = {**tracked.optimizers, **tracked.schedulers, **tracked.scalers}
    paths = [path for kind in ("optimizers", "schedulers", "scalers") for path in ref[kind]
             if all(path in e[kind] for e in everyone)]
    skip = set(rank_specific)
    wanted = sorted(n for n in ref["plain"] if n not in skip) if any(e["fresh"] for e in everyone) else []
    keys = [f"o {path}" for path in paths] + (["plain"] if wanted else [])
    blobs = _blobs(pieces, ref["pieces"], keys) if ahead else []
    with torch.no_grad():  # every model's tensors in a few packed broadcasts, not one each
        counts["collectives"] = broadcast_tensors(tensors + blobs, src)
    if ahead:
        if dist.get_rank() != src:
            for path, blob in zip(paths, blobs):
                stateful[path].load_state_dict(_loads(blob, ref["pieces"][f"o {path}"]))
        if fresh and wanted:
            namespace.update(_loads(blobs[-1], ref["pieces"]["plain"]))  # the source's plain variables but skip's
        counts["objects"], counts["variables"] = len(paths), len(wanted)
    elif paths or wanted:  # every optimizer, scheduler and scaler, and the plain variables new ranks get: one broadcast
        box = [{"state": {path: stateful[path].state_dict() for path in paths},
                "plain": {n: namespace[n] for n in wanted}} if dist.get_rank() == src else None]
        dist.broadcast_object_list(box, src=src)
        if dist.get_rank() != src:
            for path in paths:
                stateful[path].load_state_dict(box[0]["state"][path])
        if fresh:
            namespace.update(box[0]["plain"])
        counts["objects"], counts["variables"] = len(paths), len(wanted)
    logger.debug("synchronised %s", counts)
    return agreed_wrappers(tracked, everyone), (missing if fresh else []), (received if fresh else [])


def _pieces(namespace: Dict[str, Any], tracked: Tracked, plain: Sequence[str],
            rank_specific: Sequence[str]) -> Dict[str, bytes]:
    """On the source rank: each optimizer's, scheduler's and scaler's state (``"o PATH"``) and its ``plain`` variables
    but the rank-specific ones (``"plain"``: what a fresh rank gets), pickled."""
    out = {f"o {path}": pickle.dumps(obj.state_dict(), protocol=pickle.HIGHEST_PROTOCOL)
           for objs in (tracked.optimizers, tracked.schedulers, tracked.scalers) for path, obj in objs.items()}
    skip = set(rank_specific)
    out["plain"] = pickle.dumps({n: namespace[n] for n in plain if n not in skip}, protocol=pickle.HIGHEST_PROTOCOL)
    return out


def _blobs(pieces: Dict[str, bytes], sizes: Dict[str, int], keys: Sequence[str]) -> List[Any]:
    """The pieces of ``keys`` as float32 tensors (zero-padded to whole elements), to travel in a model's packed
    bucket: the source's bytes, or empty ones of the sizes its inventory gave on every other rank."""
    import torch  # torch: loaded on first use, not on import raytrain_nb

    out = []
    for key in keys:
        n = -(-sizes[key] // 4)
        if key in pieces:
            out.append(torch.frombuffer(bytearray(pieces[key].ljust(n * 4, b"\0")), dtype=torch.float32))
        else:
            out.append(torch.empty(n, dtype=torch.float32))
    return out


def _loads(blob: Any, size: int) -> Any:
    """The object of a piece received in :func:`_blobs`'s form (``size``: its pickle's bytes)."""
    return pickle.loads(blob.numpy().tobytes()[:size])


def agreed_wrappers(tracked: Tracked, everyone: List[Dict[str, Any]]) -> List[Any]:
    """The DDP wrappers every rank holds at the same path with the same shapes, in path order.

    Only these are re-bound (re-binding is a collective): a wrapper some rank lacks stays unbound,
    with a warning, rather than leave its peers waiting in DDP's constructor.
    """
    paths = sorted(tracked.wrappers)
    agreed = [p for p in paths if all(e["wrappers"].get(p) == everyone[0]["wrappers"].get(p) for e in everyone)]
    for path in sorted(set(paths) - set(agreed)):
        logger.warning("the DDP model %r is not held alike by every rank; it is not re-bound", path)
    return [tracked.wrappers[p] for p in agreed]
