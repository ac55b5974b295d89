"""A run's directory in storage (``<storage_path>/<name>``): its checkpoint manager, the numbering of
reported checkpoints, committing them once every rank reported, and ``metrics.jsonl``."""
from __future__ import annotations

import logging
import re
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..errors import CheckpointError
from . import reported
from .manager import CheckpointEntry, CheckpointManager
from .metrics_log import append_metrics
from .staging import STAGING_DIR, commit_dir
from .storage import default_storage_path, join, refuse_per_process, resolve, to_url
from .storage_check import clear_markers, collect_markers, write_marker

logger = logging.getLogger(__name__)

_REPORTED = re.compile(r"^checkpoint_(\d+)$")


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
        self.background: Optional[threading.Thread] = None  # an --async snapshot being written

    def _next_report_number(self) -> int:
        fs, run = resolve(self.url)
        numbers = [int(m.group(1)) for e in self.manager.list() for m in [_REPORTED.match(e.name)] if m]
        try:
            staged = [p.rsplit("/", 1)[-1] for p in fs.ls(join(run, STAGING_DIR), detail=False)]
        except FileNotFoundError:
            staged = []
        numbers += [int(m.group(1)) for n in staged for m in [_REPORTED.match(n)] if m]
        return max(numbers, default=0) + 1

    def check_shared(self, on_workers: Callable[[str, str], Any], num_workers: int) -> None:
        """Every worker reads the driver's marker and writes its own, which the driver reads.

        Args:
            on_workers: ``on_workers(url, token)`` runs :func:`~.storage_check.read_marker` on every
                rank (the group's ``execute``).
            num_workers: how many ranks must have written a marker.

        Raises:
            StorageError: naming the path and the cause (e.g. a local path on several nodes).
        """
        token = write_marker(self.url)
        try:
            on_workers(self.url, token)
            collect_markers(self.url, token, range(num_workers))
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
        staged = reported.report_staging(self.url, name)
        state = reported.upload_state(staged)
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
            reported.clear_markers(staged)
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
            state = reported.upload_state(reported.report_staging(self.url, name))
            if state and all(s == "done" for s in state.values()):
                metrics = reported.done_metrics(reported.report_staging(self.url, name), 0)
                if self._commit(name, metrics) is not None:
                    committed.append(name)
        return committed

    def advance(self, reports: int) -> None:
        """After a cell: the next cell numbers its reported checkpoints after this one's."""
        self.report_base += reports
