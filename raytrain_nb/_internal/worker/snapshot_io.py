"""Worker side of snapshots: take, write and load the warm state of one rank.

Snapshot layout (one committed directory)::

    replicated.pt      models, optimizers, schedulers, grad scalers (written by rank 0)
    vars.pt            the plain variables of --vars (rank 0; absent when none were named)
    rank-<r>.json      RNG states of rank r and its plain variables' fingerprints (written by each rank; plain
                       data: generator bytes in base64; snapshots written before kept them in rank-<r>.pt)
    snapshot.json      world size, variable names, fingerprints of plain variables, the sharded part (rank 0)
    sharded/           sharded (FSDP2) models and their optimizers: one DCP checkpoint, each rank's own shards
                       in __<r>_0.distcp, DCP's .metadata (read with a restricted unpickler, :mod:`.dcp_safe`)

A trial's ``raytrain_nb.tune.save_state`` writes the same layout with ``replicated.pt`` and
``snapshot.json`` only (no fingerprints), so a group loads it like a snapshot (``group.load``).

Storage may be shared, so ``replicated.pt`` always loads with ``weights_only=True`` and ``rank-<r>.json`` is
JSON; ``--allow-pickle`` loosens only ``vars.pt``. Snapshots written before
``vars.pt`` kept the variables in ``replicated.pt``: they load when those are weights-only safe.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, Optional, Sequence

from ..checkpoint.staging import StagedDir, verify_dir
from ..checkpoint.storage import is_local, join, resolve, to_url
from ..errors import CheckpointError, SnapshotError
from .copy_pool import CopyPool
from . import rng, sharded_io
from .snapshot import capture, changed_since, find_tracked, fingerprint, loads, restore

logger = logging.getLogger(__name__)

REPLICATED = "replicated.pt"
VARS = "vars.pt"
META = "snapshot.json"


def rank_file(rank: int) -> str:
    return f"rank-{rank}.json"


def older_rank_file(rank: int) -> str:
    """Where snapshots written before ``rank-<r>.json`` kept a rank's RNG states (tensors, weights-only)."""
    return f"rank-{rank}.pt"


def take(namespace: Dict[str, Any], rank: int, world_size: int, var_names: Sequence[str],
         copy: bool = True, pool: Optional[CopyPool] = None) -> Dict[str, Any]:
    """The tracked state now; with ``copy``, CPU copies to write later (even while training goes on), into
    ``pool``'s spare buffers where it has them. The state every rank holds alike is taken (and copied) by rank 0
    only, which writes it."""
    replicated, own, variables = capture(namespace, var_names, copy=copy, shared=rank == 0, pool=pool)
    own["fingerprint"] = prints = fingerprint(namespace)  # this rank's, to tell what changed at rollback
    tracked = find_tracked(namespace, strict=False)
    sharded = None
    if tracked.sharded:  # every rank: its own shards, written with DCP on a group of its own
        sharded = {"state": sharded_io.state_of(tracked, copy), "record": sharded_io.record(tracked),
                   "group": sharded_io.dcp_group()}
    return {"rank": rank, "world_size": world_size, "replicated": replicated if rank == 0 else None,
            "variables": variables if rank == 0 else None, "own": own, "vars": list(var_names),
            "fingerprint": prints, "sharded": sharded}


def write(taken: Dict[str, Any], staged: StagedDir) -> None:
    """Write a taken snapshot's files for this rank into the staged directory."""
    rank = taken["rank"]
    if taken["replicated"] is not None:
        _save(taken["replicated"], staged, REPLICATED)
        if taken["variables"]:  # none named: no file (a rollback then loads two files a rank, not three)
            _save(taken["variables"], staged, VARS)
        meta = {"world_size": taken["world_size"], "vars": taken["vars"], "fingerprint": taken["fingerprint"]}
        if taken.get("sharded"):
            meta["sharded"] = taken["sharded"]["record"]
        _write_bytes(json.dumps(meta).encode(), staged, META)
    _write_bytes(json.dumps(taken["own"]).encode(), staged, rank_file(rank))
    if taken.get("sharded"):
        sharded_io.write(taken["sharded"]["state"], staged, taken["sharded"]["group"])


def _save(obj: Any, staged: StagedDir, name: str) -> None:
    import torch  # torch: loaded on first use, not on import raytrain_nb

    if is_local(staged.fs):  # straight to the file: no fsspec buffering on the hot path
        os.makedirs(staged.path, exist_ok=True)
        torch.save(obj, os.path.join(staged.path, name))
    else:
        with staged.open(name) as fh:
            torch.save(obj, fh)


def _write_bytes(data: bytes, staged: StagedDir, name: str) -> None:
    if is_local(staged.fs):
        os.makedirs(staged.path, exist_ok=True)
        with open(os.path.join(staged.path, name), "wb") as fh:
            fh.write(data)
    else:
        with staged.open(name) as fh:
            fh.write(data)


def _cat(fs: Any, path: str) -> bytes:
    """A small file's bytes (a local one without fsspec's buffering)."""
    if is_local(fs):
        with open(path, "rb") as fh:
            return fh.read()
    return fs.cat_file(path)


def _read(fs: Any, path: str) -> Any:
    """A local path (to memory-map) or the file's bytes."""
    return path if is_local(fs) else fs.cat_file(path)


def state_files(url: str) -> Dict[str, int]:
    """The files of the state checkpoint at ``url`` (a snapshot, or ``save_state``'s), checked.

    Raises:
        CheckpointError: the directory is missing, interrupted, damaged, or holds no
            ``replicated.pt`` / ``snapshot.json`` (someone's own files: not loadable by name).
    """
    fs, path = resolve(url)
    files = verify_dir(fs, path)  # every file present with its committed size; only those are read
    missing = [name for name in (REPLICATED, META) if name not in files]
    if missing:
        raise CheckpointError(f"checkpoint {to_url(fs, path)} holds no {' or '.join(missing)}: it is neither a "
                              "snapshot nor written by raytrain_nb.tune.save_state(), so nothing in it is named; "
                              "load its files yourself (Checkpoint.as_directory())")
    return files


def read_replicated(url: str) -> Dict[str, Any]:
    """The named states (``modules``, ``optimizers``, ...) of the state checkpoint at ``url``, weights only."""
    fs, path = resolve(url)
    state_files(url)
    return loads(_read(fs, join(path, REPLICATED)), f"{to_url(fs, path)}/{REPLICATED}", may_pickle=False)


def write_state(url: str, replicated: Dict[str, Any], world_size: int) -> None:
    """Write named states in the snapshot layout (``replicated.pt`` and ``snapshot.json``) into ``url``."""
    import torch  # torch: loaded on first use, not on import raytrain_nb

    fs, path = resolve(url)
    fs.makedirs(path, exist_ok=True)
    with fs.open(join(path, REPLICATED), "wb") as fh:
        torch.save(replicated, fh)
    meta = {"world_size": world_size, "vars": [], "fingerprint": None, "written_by": "save_state"}
    fs.pipe_file(join(path, META), json.dumps(meta).encode())


def read_meta(url: str) -> Dict[str, Any]:
    """``snapshot.json`` of the state checkpoint at ``url`` (the driver reads it once and hands it to the ranks).

    Raises:
        SnapshotError: it is not JSON.
    """
    fs, path = resolve(url)
    return _json(_cat(fs, join(path, META)), f"{to_url(fs, path)}/{META}")


def _json(data: bytes, what: str) -> Dict[str, Any]:
    try:
        value = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise SnapshotError(f"{what} is truncated or damaged ({type(exc).__name__}: {str(exc)[:160]}); nothing was "
                            "loaded") from None
    if not isinstance(value, dict):
        raise SnapshotError(f"{what} holds a {type(value).__name__}, not the object it was written as; nothing "
                            "was loaded")
    return value


def _rank_state(fs: Any, path: str, url: str, rank: int, files: Dict[str, int]) -> Optional[Dict[str, Any]]:
    """This rank's own part (``{"rng": ..., "fingerprint": ...}``) in either form, its RNG states checked and made
    ready (:func:`.rng.decode`); None when the snapshot holds none for this rank (a ``save_state`` checkpoint)."""
    if rank_file(rank) in files:
        what = f"{url}/{rank_file(rank)}"
        own = _json(_cat(fs, join(path, rank_file(rank))), what)
    elif older_rank_file(rank) in files:
        what = f"{url}/{older_rank_file(rank)}"
        own = loads(_read(fs, join(path, older_rank_file(rank))), what, may_pickle=False)
    else:
        return None
    if "rng" in own:
        own["rng"] = rng.decode(own["rng"], f"{what}: the RNG state")
    return own


def load(namespace: Dict[str, Any], url: str, rank: int, allow_pickle: bool = False,
         action: str = "roll back", files: Optional[Dict[str, int]] = None,
         meta: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Roll this rank's namespace back to the snapshot at ``url`` (or load a ``save_state``
    checkpoint into it), in place.

    Args:
        namespace: the rank's namespace.
        url: the committed snapshot directory.
        rank: this rank (which ``rank-<r>.json`` to load).
        allow_pickle: let ``vars.pt`` (only) unpickle code; weights and RNG states never do.
        action: what errors call it (``roll back``, ``load``).
        files: :func:`state_files` of ``url`` as the driver checked them just before (a committed directory does
            not change): not listed again on every rank (N listings of N files; on object storage N requests).
        meta: :func:`read_meta` of ``url`` as the driver read it (not read again on every rank).

    Returns:
        ``{"restored": [...names], "changed": [...plain variables changed since, not restored]}``.

    Raises:
        CheckpointError / SnapshotError: a missing, truncated or edited file (named); nothing loaded.
    """
    fs, path = resolve(url)
    files = state_files(url) if files is None else files
    meta = read_meta(url) if meta is None else meta
    replicated = loads(_read(fs, join(path, REPLICATED)), f"{url}/{REPLICATED}", may_pickle=False)
    own = _rank_state(fs, path, url, rank, files)
    variables = None  # older snapshots: in replicated.pt, loaded weights-only above
    if VARS in files:
        variables = loads(_read(fs, join(path, VARS)), f"{url}/{VARS}", allow_pickle)
    if meta.get("sharded"):
        sharded_io.check_present(find_tracked(namespace), meta["sharded"], action)  # before anything loads
    restored = restore(namespace, replicated, (own or {}).get("rng"), variables, action)
    if meta.get("sharded"):  # every rank loads its shards (DCP reshards a snapshot of another world size)
        restored += sharded_io.load(find_tracked(namespace), url, meta["sharded"], allow_pickle, action)
    before = (own or {}).get("fingerprint") or meta.get("fingerprint", {})
    changed = [] if before is None else changed_since(namespace, before, restored)  # save_state keeps none
    return {"restored": restored, "changed": changed}
