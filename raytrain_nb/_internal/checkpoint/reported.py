"""Reported checkpoints in storage: every rank uploads into one staged directory, marking its
upload started and done, so a crash never commits half of one.

``report(metrics, checkpoint=...)`` on a worker calls :func:`upload`; the driver reads
:func:`upload_state` to decide what to commit.
"""
from __future__ import annotations

import json
from typing import Any, Dict, Optional

from .staging import STAGING_DIR, WRITING_MARKER, StagedDir
from .storage import is_local, join, resolve

MARKERS = ".markers"


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
