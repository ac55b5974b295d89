"""Worker side of checkpoints: write and load snapshots of the warm state; upload reported checkpoints.

Snapshot layout (one committed directory)::

    replicated.pt      models, optimizers, schedulers, grad scalers, --vars (written by rank 0)
    rank-<r>.pt        RNG states of rank r (written by each rank)
    snapshot.json      world size, variable names, fingerprints of plain variables (rank 0)

A reported checkpoint (``report(metrics, checkpoint=...)``) is uploaded by
each rank that passes one into the same staged directory; a rank marks its
upload started and done so a crash never commits half of it.
"""
from __future__ import annotations

import json
import logging
import os
from typing import Any, Dict, Optional, Sequence

from .snapshot import capture, changed_since, fingerprint, loads, restore
from .staging import STAGING_DIR, WRITING_MARKER, StagedDir, verify_dir
from .storage import is_local, join, resolve

logger = logging.getLogger(__name__)

REPLICATED = "replicated.pt"
META = "snapshot.json"
MARKERS = ".markers"


def rank_file(rank: int) -> str:
    return f"rank-{rank}.pt"


def take(namespace: Dict[str, Any], rank: int, world_size: int, var_names: Sequence[str],
         copy: bool = True) -> Dict[str, Any]:
    """The tracked state now; with ``copy``, CPU copies to write later (even while training goes on)."""
    replicated, own = capture(namespace, var_names, copy=copy)
    own["fingerprint"] = fingerprint(namespace)  # this rank's, to tell what changed at rollback
    return {"rank": rank, "world_size": world_size, "replicated": replicated if rank == 0 else None,
            "own": own, "vars": list(var_names), "fingerprint": fingerprint(namespace)}


def write(taken: Dict[str, Any], staged: StagedDir) -> None:
    """Write a taken snapshot's files for this rank into the staged directory."""
    rank = taken["rank"]
    if taken["replicated"] is not None:
        _save(taken["replicated"], staged, REPLICATED)
        meta = {"world_size": taken["world_size"], "vars": taken["vars"], "fingerprint": taken["fingerprint"]}
        with staged.open(META) as fh:
            fh.write(json.dumps(meta).encode())
    _save(taken["own"], staged, rank_file(rank))


def _save(obj: Any, staged: StagedDir, name: str) -> None:
    import torch

    if is_local(staged.fs):  # straight to the file: no fsspec buffering on the hot path
        os.makedirs(staged.path, exist_ok=True)
        torch.save(obj, os.path.join(staged.path, name))
    else:
        with staged.open(name) as fh:
            torch.save(obj, fh)


def _read(fs: Any, path: str) -> Any:
    """A local path (to memory-map) or the file's bytes."""
    return path if is_local(fs) else fs.cat_file(path)


def load(namespace: Dict[str, Any], url: str, rank: int, allow_pickle: bool = False) -> Dict[str, Any]:
    """Roll this rank's namespace back to the snapshot at ``url``, in place.

    Returns:
        ``{"restored": [...names], "changed": [...plain variables changed since, not restored]}``.

    Raises:
        CheckpointError / SnapshotError: a missing, truncated or edited file (named); nothing loaded.
    """
    fs, path = resolve(url)
    verify_dir(fs, path)  # every file present with its committed size
    meta = json.loads(fs.cat_file(join(path, META)).decode())
    replicated = loads(_read(fs, join(path, REPLICATED)), f"{url}/{REPLICATED}", allow_pickle)
    own: Optional[Dict[str, Any]] = None
    if fs.exists(join(path, rank_file(rank))):
        own = loads(_read(fs, join(path, rank_file(rank))), f"{url}/{rank_file(rank)}", allow_pickle)
    restored = restore(namespace, replicated, own)
    before = (own or {}).get("fingerprint") or meta.get("fingerprint", {})
    return {"restored": restored, "changed": changed_since(namespace, before, restored)}


# -- reported checkpoints -----------------------------------------------------------------


def report_staging(run_url: str, name: str) -> StagedDir:
    """The staged directory every rank writes report ``name`` into (the same on all ranks)."""
    fs, run = resolve(run_url)
    final = join(run, name)
    path = join(run, STAGING_DIR, name) if is_local(fs) else final
    return StagedDir(fs=fs, path=path, final_path=final, name=name)


def marker(staged: StagedDir, rank: int, state: str) -> str:
    base = staged.final_path.rsplit("/", 1)[0]
    return join(base, STAGING_DIR, MARKERS, f"{staged.name}.rank-{rank}.{state}")


def upload(staged: StagedDir, rank: int, local_dir: str, metrics: Optional[Dict[str, Any]] = None) -> None:
    """Copy this rank's checkpoint files into the staged directory, marking start and end."""
    fs = staged.fs
    fs.makedirs(staged.path, exist_ok=True)
    start = marker(staged, rank, "started")
    fs.makedirs(start.rsplit("/", 1)[0], exist_ok=True)
    fs.pipe_file(start, b"")
    if not fs.exists(join(staged.path, WRITING_MARKER)):  # what commit_dir expects of a staged dir
        fs.pipe_file(join(staged.path, WRITING_MARKER), b"{}")
    staged.put_dir(local_dir)
    fs.pipe_file(marker(staged, rank, "done"), json.dumps(metrics or {}, default=str).encode())


def done_metrics(staged: StagedDir, rank: int) -> Dict[str, Any]:
    """The metrics rank ``rank`` reported with its upload (kept in its done marker)."""
    try:
        return json.loads(staged.fs.cat_file(marker(staged, rank, "done")).decode() or "{}")
    except (FileNotFoundError, ValueError):
        return {}


def upload_state(staged: StagedDir) -> Dict[int, str]:
    """``{rank: "started"|"done"}`` for every rank that began uploading into ``staged``."""
    fs = staged.fs
    base = marker(staged, 0, "x").rsplit("/", 1)[0]
    out: Dict[int, str] = {}
    fs.invalidate_cache(base)
    try:
        names = [p.rsplit("/", 1)[-1] for p in fs.ls(base, detail=False)]
    except FileNotFoundError:
        return out
    prefix = f"{staged.name}.rank-"
    for name in names:
        if name.startswith(prefix):
            rank_s, _, state = name[len(prefix):].partition(".")
            if rank_s.isdigit() and (state == "done" or out.get(int(rank_s)) != "done"):
                out[int(rank_s)] = state
    return out


def clear_markers(staged: StagedDir) -> None:
    for rank in upload_state(staged):
        for state in ("started", "done"):
            try:
                staged.fs.rm_file(marker(staged, rank, state))
            except FileNotFoundError:
                pass
