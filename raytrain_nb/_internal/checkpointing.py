"""Driver side of checkpoints: the run directory, snapshots, rollback, and committing reported checkpoints.

``WorkerGroup.checkpoint`` / ``rollback`` / ``checkpoints`` call into here; the
:class:`RunStorage` of a group owns its :class:`CheckpointManager`.
"""
from __future__ import annotations

import dataclasses
import logging
import re
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from . import ckpt_worker
from .checkpoint_manager import CheckpointEntry, CheckpointManager
from .errors import CheckpointError
from .metrics_log import append_metrics
from .staging import STAGING_DIR, commit_dir, discard_dir
from .storage import default_storage_path, join, refuse_per_process, resolve, to_url
from .storage_check import clear_markers, collect_markers, write_marker

if TYPE_CHECKING:
    from .group import WorkerGroup

logger = logging.getLogger(__name__)

SNAPSHOT_TIMEOUT_S = 60.0
_REPORTED = re.compile(r"^checkpoint_(\d+)$")


@dataclasses.dataclass
class RollbackResult:
    """What :meth:`WorkerGroup.rollback` did."""

    name: str
    restored: List[str]
    changed: List[str]

    def __str__(self) -> str:
        text = f"rolled back to {self.name}: restored {', '.join(self.restored) or 'nothing'}"
        if self.changed:
            text += (f"; not restored and changed since the snapshot: {', '.join(self.changed)} "
                     "(name them with --vars to save them too)")
        return text


class RunStorage:
    """A group's run directory: ``<storage_path>/<name>``, its checkpoints and ``metrics.jsonl``."""

    def __init__(self, storage_path: Optional[str], name: str, num_to_keep: Optional[int] = None,
                 score_attribute: Optional[str] = None, score_order: str = "max") -> None:
        base = storage_path or default_storage_path()
        refuse_per_process(base)
        fs, path = resolve(base)
        self.url = to_url(fs, join(path, name))
        try:
            fs.makedirs(join(path, name), exist_ok=True)
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"cannot create the run directory {self.url}: {exc}: pass a writable "
                                  "--storage URL") from exc
        self.manager = CheckpointManager(self.url, num_to_keep, score_attribute, score_order)
        self.report_base = self._next_report_number()
        self._pending: Dict[str, Dict[int, bool]] = {}
        self._lock = threading.Lock()
        self.background_error: Optional[str] = None
        self._background: Optional[threading.Thread] = None

    def _next_report_number(self) -> int:
        fs, run = resolve(self.url)
        numbers = [int(m.group(1)) for e in self.manager.list() for m in [_REPORTED.match(e.name)] if m]
        try:
            staged = [p.rsplit("/", 1)[-1] for p in fs.ls(join(run, STAGING_DIR), detail=False)]
        except FileNotFoundError:
            staged = []
        numbers += [int(m.group(1)) for n in staged for m in [_REPORTED.match(n)] if m]
        return max(numbers, default=0) + 1

    def check_shared(self, group: "WorkerGroup") -> None:
        """Every worker reads the driver's marker and writes its own, which the driver reads.

        Raises:
            StorageError: naming the path and the cause (e.g. a local path on several nodes).
        """
        token = write_marker(self.url)
        try:
            group.execute(_read_marker_here, self.url, token)
            collect_markers(self.url, token, range(group.num_workers))
        finally:
            clear_markers(self.url, token)

    # -- reported checkpoints --------------------------------------------------------------

    def on_records(self, records: Sequence[Dict[str, Any]], world_size: int) -> None:
        """Append rank 0's metrics to ``metrics.jsonl``; commit a reported checkpoint once every rank reported."""
        lines = [dict(r["metrics"], _time=r["time"]) for r in records if r["rank"] == 0]
        if lines:
            try:
                append_metrics(self.url, lines)
            except Exception as exc:  # noqa: BLE001 - metrics logging never breaks training
                logger.warning("cannot append to %s/metrics.jsonl: %s", self.url, exc)
        for rec in records:
            key = rec.get("report")
            if key is None:
                continue
            with self._lock:
                pending = self._pending.setdefault(key, {"ranks": 0, "files": False, "metrics": {}})
                pending["ranks"] += 1
                pending["files"] |= bool(rec.get("checkpoint"))
                if rec["rank"] == 0:
                    pending["metrics"] = rec["metrics"]
                complete = pending["ranks"] >= world_size
                if complete:
                    del self._pending[key]
            if complete and pending["files"]:
                self._commit(key, pending["metrics"])

    def _commit(self, name: str, metrics: Optional[Dict[str, Any]] = None) -> Optional[CheckpointEntry]:
        staged = ckpt_worker.report_staging(self.url, name)
        state = ckpt_worker.upload_state(staged)
        if not state or any(s != "done" for s in state.values()):
            logger.warning("checkpoint %s not committed: uploads unfinished (%s)", name, state)
            return None
        try:
            commit_dir(staged)
            entry = self.manager.register(name, "reported", staged.final_url, metrics or {})
        except CheckpointError as exc:
            logger.warning("checkpoint %s not committed: %s", name, exc)
            return None
        finally:
            ckpt_worker.clear_markers(staged)
        logger.info("committed %s", entry.name)
        return entry

    def recover(self) -> List[str]:
        """Commit reported checkpoints whose every started upload finished (after a crash)."""
        fs, run = resolve(self.url)
        try:
            staged = [p.rsplit("/", 1)[-1] for p in fs.ls(join(run, STAGING_DIR), detail=False)]
        except FileNotFoundError:
            return []
        committed = []
        for name in sorted(n for n in staged if _REPORTED.match(n)):
            state = ckpt_worker.upload_state(ckpt_worker.report_staging(self.url, name))
            if state and all(s == "done" for s in state.values()):
                metrics = ckpt_worker.done_metrics(ckpt_worker.report_staging(self.url, name), 0)
                if self._commit(name, metrics) is not None:
                    committed.append(name)
        return committed

    def advance(self, reports: int) -> None:
        """After a cell: the next cell numbers its reported checkpoints after this one's."""
        self.report_base += reports


def _read_marker_here(url: str, token: str) -> None:
    """On a worker: read the driver's marker, write this rank's."""
    from .session import get_context
    from .storage_check import read_marker

    read_marker(url, token, rank=get_context().get_world_rank())


def checkpoint(group: "WorkerGroup", name: Optional[str], var_names: Sequence[str], blocking: bool,
               timeout_s: float) -> Optional[CheckpointEntry]:
    """Snapshot the tracked state of every rank (see :meth:`WorkerGroup.checkpoint`)."""
    import ray

    from .group import GroupState

    run = group.run_storage
    if run.background_error:
        err, run.background_error = run.background_error, None
        raise CheckpointError(f"an earlier background checkpoint failed: {err}")
    staged = run.manager.begin("snapshot", name)
    actors = [s.actor for s in group._slots]
    try:
        if group.state is GroupState.RUNNING:  # a step boundary: the next report() on every rank
            ray.get([a.request_snapshot.remote(staged, list(var_names)) for a in actors])
            waits = [a.snapshot_wait.remote(timeout_s) for a in actors]
            ready, _ = ray.wait(waits, num_returns=len(waits), timeout=timeout_s + 5)
            if len(ready) < len(waits) or any(r.get("timeout") for r in group._get(ready, 30, "snapshot")):
                ray.get([a.cancel_snapshot.remote() for a in actors])
                raise CheckpointError(f"no report() came on every rank within {timeout_s:g} s while the cell "
                                      "ran, so no consistent snapshot could be taken: try again between cells")
        else:
            group._check_usable()
            group._get([a.snapshot.remote(staged, list(var_names), not blocking) for a in actors], 600,
                       "snapshot")
            if not blocking:
                waits = [a.snapshot_wait.remote() for a in actors]
                thread = threading.Thread(target=_finish_background, args=(group, staged, waits),
                                          name="rtnb-snapshot-commit", daemon=True)
                run._background = thread
                thread.start()
                return None
    except BaseException:
        discard_dir(staged)
        raise
    return run.manager.commit(staged, "snapshot", _metrics_of(group))


def _metrics_of(group: "WorkerGroup") -> Dict[str, Any]:
    return dict(group.latest_metrics.get(0, {}))


def _finish_background(group: "WorkerGroup", staged: Any, waits: List[Any]) -> None:
    import ray

    run = group.run_storage
    try:
        ray.get(waits)
        run.manager.commit(staged, "snapshot", _metrics_of(group))
    except Exception as exc:  # noqa: BLE001 - reported in the next cell
        from .monitor import death_cause

        discard_dir(staged)
        if isinstance(exc, ray.exceptions.RayActorError):
            why = f"a worker died while writing it ({death_cause(exc)})"
        else:
            cause = getattr(exc, "cause", None) or exc
            why = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
        run.background_error = f"{staged.name}: {why}"
        logger.warning("background checkpoint %s failed: %s", staged.name, why)


def wait_background(group: "WorkerGroup") -> None:
    """Wait for a background checkpoint to commit (``--async``)."""
    thread = group.run_storage._background
    if thread is not None:
        thread.join()


def rollback(group: "WorkerGroup", name_or_index: Union[str, int], run: Optional[str],
             allow_pickle: bool) -> RollbackResult:
    """Load a snapshot into every rank's objects in place (see :meth:`WorkerGroup.rollback`)."""
    group._check_usable()
    manager = group.run_storage.manager if run is None else CheckpointManager.load(
        join(group.run_storage.url.rsplit("/", 1)[0], run))
    wait_background(group)
    snapshots = manager.list("snapshot")
    if name_or_index == "latest":
        if not snapshots:
            raise CheckpointError(f"no snapshot to roll back to in {manager.run_dir}: take one with "
                                  "%dist_checkpoint (group.checkpoint())")
        entry = snapshots[-1]
    else:
        entry = manager.get(name_or_index)
    if entry.kind != "snapshot":
        raise CheckpointError(f"{entry.name} is a reported checkpoint (your own files): load it in a cell with "
                              "raytrain_nb.get_checkpoint() or Checkpoint; rollback takes snapshots")
    results = group._get([s.actor.rollback.remote(entry.path, allow_pickle) for s in group._slots], 600,
                         "roll back")
    changed = sorted({n for r in results for n in r["changed"]})
    return RollbackResult(entry.name, results[0]["restored"], changed)
