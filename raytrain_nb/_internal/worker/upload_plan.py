"""How one reported checkpoint reaches the run directory (copied, in place, or by the user's upload function),
checked before anything is written; and the reported checkpoints as ``get_all_reported_checkpoints`` lists them."""
from __future__ import annotations

import logging
import os
import time
from typing import Any, Callable, Dict, List, Optional, Set

from ..checkpoint import reported
from ..checkpoint.checkpoint import delete_local
from ..checkpoint.index import INDEX_FILE, entry_report
from ..checkpoint.manager import CheckpointManager
from ..checkpoint.metrics_log import last_report_index
from ..checkpoint.staging import STAGING_DIR
from ..checkpoint.storage import is_dir_name, is_local, join, resolve, to_url
from ..errors import CheckpointError
from .report_api import (CheckpointConsistencyMode, CheckpointUploadMode, ReportedCheckpoint,
                         ReportedCheckpointStatus, ReportOptions)

logger = logging.getLogger(__name__)

#: An index entry's validation status -> Ray Train's status of the reported checkpoint.
STATUSES = {None: ReportedCheckpointStatus.COMMITTED, "pending": ReportedCheckpointStatus.PENDING_VALIDATION,
            "validated": ReportedCheckpointStatus.VALIDATED, "timeout": ReportedCheckpointStatus.VALIDATION_TIMEOUT,
            "failed": ReportedCheckpointStatus.VALIDATION_FAILED}
#: How often ``get_all_reported_checkpoints`` looks, and says what it still waits for.
LOOK_S, SAY_S = 0.1, 30.0


def plan(run_url: str, key: str, rank: int, world: int, checkpoint: Any, metrics: Dict[str, Any],
         options: Optional[ReportOptions], used: Set[str]) -> Callable[[], Dict[str, Any]]:
    """Check a report's checkpoint options now; return ``job() -> the record's fields``, which uploads it.

    Raises:
        ValueError: a directory name used already in the run, a checkpoint whose directory holds the run
            directory while it is to be deleted, a ``NO_UPLOAD`` checkpoint outside the run.
    """
    opts = options or ReportOptions()
    if opts.mode is CheckpointUploadMode.NO_UPLOAD:
        name = inside_run(run_url, checkpoint, "report(checkpoint_upload_mode=NO_UPLOAD)'s checkpoint")
        return _in_place(run_url, key, name, rank, world, metrics)
    name = opts.dir_name
    if name is not None:
        _check_unused(run_url, name, used)
        used.add(name)
    if opts.delete_local:
        _refuse_holding_run(run_url, checkpoint)
    if opts.upload_fn is not None:
        def by_user() -> Dict[str, Any]:
            out = opts.upload_fn(checkpoint, name or key)
            if not hasattr(out, "path"):
                raise ValueError(f"checkpoint_upload_fn returned {type(out).__name__}, not a Checkpoint: return "
                                 "Checkpoint(path) of the directory it wrote inside the run directory")
            where = inside_run(run_url, out, "the checkpoint that checkpoint_upload_fn returned")
            fields = _in_place(run_url, key, where, rank, world, metrics)()
            if opts.delete_local:
                delete_local(checkpoint)
            return fields
        return by_user
    staged = reported.report_staging(run_url, key, name)

    def copy() -> Dict[str, Any]:
        with checkpoint.as_directory() as local:
            reported.upload(staged, rank, local, metrics, world_size=world)
        if opts.delete_local:
            delete_local(checkpoint)
        return {"dir": name} if name else {}
    return copy


def _in_place(run_url: str, key: str, name: str, rank: int, world: int,
              metrics: Dict[str, Any]) -> Callable[[], Dict[str, Any]]:
    staged = reported.report_staging(run_url, key, name, in_place=True)

    def mark() -> Dict[str, Any]:
        reported.upload(staged, rank, None, metrics, world_size=world)
        return {"dir": name, "in_place": True}
    return mark


def _check_unused(run_url: str, name: str, used: Set[str]) -> None:
    fs, run = resolve(run_url)
    if name in used or fs.exists(join(run, name)):
        raise ValueError(f"report(checkpoint_dir_name={name!r}): the run {run_url} has a checkpoint directory of "
                         "that name already: give each report its own name (e.g. f'epoch_{epoch}')")


def _local_real(checkpoint: Any) -> Optional[str]:
    fs = getattr(checkpoint, "filesystem", None)
    path = getattr(checkpoint, "path", None)
    if not isinstance(path, str) or (fs is not None and not is_local(fs)):
        return None
    return os.path.realpath(path)


def _refuse_holding_run(run_url: str, checkpoint: Any) -> None:
    fs, run = resolve(run_url)
    path = _local_real(checkpoint)
    if path is None or not is_local(fs):
        return
    run_real = os.path.realpath(run)
    if run_real == path or run_real.startswith(path.rstrip("/") + "/"):
        raise ValueError(f"the run directory {run_url} is inside the checkpoint's directory {checkpoint.path}, "
                         "which report() would delete after its upload: write the checkpoint to a temporary "
                         "directory, or pass delete_local_checkpoint_after_upload=False")


def inside_run(run_url: str, checkpoint: Any, what: str) -> str:
    """The name of ``checkpoint``'s directory, which must be directly inside the run directory.

    Raises:
        ValueError: it is elsewhere (naming both), or not a directory name.
    """
    fs, run = resolve(run_url)
    path = getattr(checkpoint, "path", None)
    cfs = getattr(checkpoint, "filesystem", None)
    if isinstance(path, str):
        if is_local(fs) and (cfs is None or is_local(cfs)):
            parent, name = os.path.split(os.path.realpath(path).rstrip("/"))
            ok = parent == os.path.realpath(run).rstrip("/")
        else:
            parent, _, name = resolve(path, cfs)[1].rstrip("/").rpartition("/")
            ok = parent == run.rstrip("/") and cfs is not None and type(cfs) is type(fs)
        if ok and is_dir_name(name) and not name.startswith(STAGING_DIR):
            return name
    raise ValueError(f"{what} ({path}) is not a directory directly inside the run directory {run_url}: write it "
                     f"to {to_url(fs, join(run, '<name>'))}, or let report() upload it (SYNC or ASYNC)")


def reported_checkpoints(run_url: str, last: int, mode: CheckpointConsistencyMode,
                         timeout_s: Optional[float]) -> List[ReportedCheckpoint]:
    """The run's reported checkpoints, once the driver took every report up to this rank's last (report index
    ``last``) and committed their sets (and, ``VALIDATED``, their validations ended).

    Waits at most ``timeout_s`` (None: until then), saying every 30 s what it waits for; then lists what there is.
    """
    started = time.monotonic()
    said = started
    while True:
        waiting = _waiting_for(run_url, last, mode)
        now = time.monotonic()
        if not waiting or (timeout_s is not None and now - started >= timeout_s):
            break
        if now - said >= SAY_S:
            logger.warning("get_all_reported_checkpoints() waits %.0f s for %s", now - started, waiting)
            said = now
        time.sleep(LOOK_S)  # storage has no event to wait on: look again
    try:
        entries = CheckpointManager.load(run_url).list("reported")
    except CheckpointError:
        return []
    entries.sort(key=entry_report)
    return [ReportedCheckpoint(checkpoint=e.checkpoint, metrics=dict(e.metrics),
                               status=STATUSES.get((e.validation or {}).get("status"), STATUSES[None]))
            for e in entries]


def _waiting_for(run_url: str, last: int, mode: CheckpointConsistencyMode) -> str:
    """What is not settled yet ('' when nothing): a report up to ``last`` the driver has not taken (rank 0's line in
    ``metrics.jsonl``) or whose set it has not committed (its markers are there until then), validations."""
    if last > 0 and last_report_index(run_url) < last:
        return f"the driver to take report {last} (from rank 0)"
    unsettled = [n for n in reported.pending_names(run_url) if (reported.report_index(n) or 0) <= last]
    if unsettled:
        return f"the driver to commit {', '.join(unsettled)} (every rank must report it)"
    fs, run = resolve(run_url)
    if mode is CheckpointConsistencyMode.VALIDATED and fs.exists(join(run, INDEX_FILE)):
        try:
            pending = [e.name for e in CheckpointManager.load(run_url).list("reported")
                       if (e.validation or {}).get("status") == "pending"]
        except CheckpointError:
            return ""
        if pending:
            return f"the validation of {', '.join(pending)}"
    return ""
