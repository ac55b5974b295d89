"""Snapshots of sharded (FSDP2) models and their optimizers: each rank writes only its own shards with DCP.

A snapshot's sharded part is one DCP checkpoint in the snapshot's ``sharded/`` folder: every rank's
``__<rank>_0.distcp`` plus ``.metadata`` (written by rank 0 after the ranks agree on a plan). Its state dict is
``{"<module path>": {"model": ..., "optim": {"<optimizer path>": ...}}}`` taken through
``torch.distributed.checkpoint.state_dict`` (``get_model_state_dict`` / ``get_optimizer_state_dict``), so no rank
ever holds the whole model; rollback loads it into the same objects (DCP reshards when the snapshot was written by
another number of ranks). The DCP collectives run on a gloo group of their own, so a write in the background never
interleaves with the training loop's collectives.
"""
from __future__ import annotations

import logging
import os
import threading
import weakref
from typing import Any, Dict, Optional

from ..backend import process_group_state
from ..checkpoint.staging import StagedDir
from ..checkpoint.storage import is_local, join, resolve
from ..errors import SnapshotError
from .dcp_safe import load_metadata, reader_and_planner

logger = logging.getLogger(__name__)

FOLDER = "sharded"
_write_lock = threading.Lock()  # one DCP write at a time per process: every rank writes in the same order
#: [(a weak reference to the default process group, the gloo group DCP uses on it)]: weak, so an old process group
#: is never kept alive (its gloo sockets open) by this, and a new one at the same address is never mistaken for it
_groups: list = []


def dcp_group() -> Any:
    """The gloo group DCP's collectives use, made once per process group (a collective: every rank calls it,
    on the cell thread, at the same point). Its sockets count as the process group's, so a rank that dies during a
    background write, an interrupt or re-forming the group releases the others from DCP's collectives."""
    import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

    default = dist.group.WORLD
    if not _groups or _groups[0][0]() is not default:  # none yet, or an earlier process group's: gone with it
        group = process_group_state().open_group(lambda: dist.new_group(backend="gloo"))
        _groups[:] = [(weakref.ref(default), group)]
    return _groups[0][1]


def forget_group() -> None:
    """Drop the DCP group (its process group re-formed: the next snapshot makes a new one)."""
    _groups.clear()


def _clone(obj: Any) -> Any:
    """A copy of a (nested) state dict's tensors (a DTensor's local shard only: no communication)."""
    import torch  # torch: loaded on first use, not on import raytrain_nb

    if isinstance(obj, torch.Tensor):
        return obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _clone(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_clone(v) for v in obj)
    return obj


def state_of(tracked: Any, copy: bool) -> Dict[str, Any]:
    """The sharded state of this rank's tracked sharded modules and their optimizers (local shards; copies with
    ``copy``)."""
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_optimizer_state_dict

    state: Dict[str, Any] = {}
    for path, module in tracked.sharded.items():
        optims = {o_path: get_optimizer_state_dict(module, opt) for o_path, (opt, owner) in
                  tracked.sharded_optimizers.items() if owner == path}
        state[path] = {"model": get_model_state_dict(module), "optim": optims}
    return _clone(state) if copy else state


def write(state: Dict[str, Any], staged: StagedDir, group: Any) -> None:
    """Write this rank's shards of ``state`` into the staged snapshot's ``sharded/`` folder (every rank calls it:
    DCP plans the write collectively, on ``group``)."""
    import torch.distributed.checkpoint as dcp  # torch: loaded on first use, not on import raytrain_nb

    target = join(staged.path, FOLDER)
    if is_local(staged.fs):
        os.makedirs(target, exist_ok=True)
        writer: Any = dcp.FileSystemWriter(target)
    else:
        # torch.distributed's checkpoint and FSDP: loaded only for sharded models
        from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

        writer = FsspecWriter(staged.fs.unstrip_protocol(target))
    with _write_lock:
        dcp.save(state, storage_writer=writer, process_group=group)


def load(namespace_tracked: Any, url: str, saved: Dict[str, Any], allow_pickle: bool, action: str) -> list:
    """Load the sharded part of the snapshot at ``url`` into the tracked sharded modules and optimizers in place.

    Args:
        namespace_tracked: this rank's :class:`~.snapshot.Tracked`.
        url: the committed snapshot.
        saved: the snapshot's record of its sharded part (``snapshot.json``'s ``sharded``: paths and optimizers).
        allow_pickle: let DCP's ``.metadata`` and non-tensor items unpickle any class.
        action: what errors call it.

    Returns:
        The names restored.

    Raises:
        SnapshotError: a saved sharded model or optimizer is not in the namespace (nothing loaded).
    """
    import torch.distributed.checkpoint as dcp  # torch: loaded on first use, not on import raytrain_nb
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_optimizer_state_dict

    tracked = namespace_tracked
    check_present(tracked, saved, action)
    wanted = {p: tracked.sharded[p] for p in saved}
    live = type(tracked)({}, {}, {}, {}, sharded=wanted,
                         sharded_optimizers={o: tracked.sharded_optimizers[o] for opts in saved.values() for o in opts})
    state = state_of(live, copy=False)
    fs, path = resolve(url)
    folder = join(path, FOLDER)
    load_metadata(fs.cat_file(join(folder, ".metadata")), f"{url}/{FOLDER}/.metadata", allow_pickle)  # refused
    # here in one line (DCP would fold the refusal into a long error of its own)
    reader, planner = reader_and_planner(folder if is_local(fs) else fs.unstrip_protocol(folder), allow_pickle,
                                         None if is_local(fs) else fs)
    try:
        dcp.load(state, storage_reader=reader, planner=planner, process_group=dcp_group())
    except Exception as exc:  # noqa: BLE001 - DCP's own errors come wrapped per rank
        raise _unwrapped(exc, f"cannot {action} the sharded state from {url}/{FOLDER}") from None
    restored = []
    for p, entry in state.items():
        set_model_state_dict(wanted[p], entry["model"])
        restored.append(p)
        for o_path, osd in entry["optim"].items():
            set_optimizer_state_dict(wanted[p], tracked.sharded_optimizers[o_path][0], osd)
            restored.append(o_path)
    return restored


def _unwrapped(exc: BaseException, what: str) -> SnapshotError:
    """One line for DCP's error: the first rank's own exception inside a ``CheckpointException`` (ours as it is)."""
    causes = [pair[0] for pair in getattr(exc, "failures", {}).values() if isinstance(pair, tuple) and pair]
    for cause in causes:
        if isinstance(cause, SnapshotError):
            return cause
    cause = causes[0] if causes else exc
    text = str(cause).strip().splitlines()
    return SnapshotError(f"{what}: {type(cause).__name__}: {text[0][:200] if text else ''}")


def check_present(tracked: Any, saved: Dict[str, Any], action: str) -> None:
    """Raise unless every sharded module and optimizer ``saved`` names is in ``tracked``.

    Raises:
        SnapshotError: naming the missing ones (nothing is loaded).
    """
    lost = [p for p in saved if p not in tracked.sharded]
    lost += [o for p, opts in saved.items() for o in opts if o not in tracked.sharded_optimizers]
    if lost:
        raise SnapshotError(f"cannot {action}: sharded {', '.join(lost)} no longer exist in the workers' namespace "
                            f"(or are no longer sharded); re-create them (re-run their cell), then {action} again")


def record(tracked: Any) -> Dict[str, Any]:
    """What ``snapshot.json`` says of the sharded part: each sharded module's path -> its optimizers' paths."""
    return {p: sorted(o for o, (_, owner) in tracked.sharded_optimizers.items() if owner == p)
            for p in tracked.sharded}


def share(tracked: Any) -> Optional[Dict[str, Any]]:
    """This rank's share of its sharded modules (for ``%dist_status``), or None without one."""
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from .sharded import local_share

    if not tracked.sharded:
        return None
    shares = [local_share(m) for m in tracked.sharded.values()]
    return {"strategy": "fsdp2", "mesh_size": max(s["mesh_size"] for s in shares),
            "local_bytes": sum(s["local_bytes"] for s in shares), "total_bytes": sum(s["total_bytes"] for s in shares)}
