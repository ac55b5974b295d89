"""A run's directory in storage (``<storage_path>/<name>``): its checkpoint manager, the numbering of
reported checkpoints, committing them once every rank reported, and ``metrics.jsonl``."""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..errors import CheckpointError
from . import reported
from .lease import RunLease
from .index import entry_report
from .manager import CheckpointEntry, CheckpointManager
from .metrics_log import REPORT_KEY, append_metrics, last_report_index
from .staging import StagedDir, clean_leftovers, commit_dir
from .storage import check_run_name, default_storage_path, join, refuse_per_process, resolve, to_url
from .storage_check import clear_markers, collect_markers, write_marker

logger = logging.getLogger(__name__)

class RunStorage:
    """A group's run directory: ``<storage_path>/<name>``, its checkpoints and ``metrics.jsonl``."""

    def __init__(self, storage_path: Optional[str], name: str, num_to_keep: Optional[int] = None,
                 score_attribute: Optional[str] = None, score_order: str = "max", owner: str = "") -> None:
        check_run_name(name)  # before anything is made: '../x' would leave the storage root
        base = storage_path or default_storage_path()
        refuse_per_process(base)
        fs, path = resolve(base)
        self.url = to_url(fs, join(path, name))
        try:
            fs.makedirs(join(path, name), exist_ok=True)
        except Exception as exc:  # noqa: BLE001
            raise CheckpointError(f"cannot create the run directory {self.url}: {exc}: pass a writable "
                                  "--storage URL") from exc
        self.lease = RunLease(self.url, owner or f"a writer of run {name}")  # one writer per run
        try:
            self._open(num_to_keep, score_attribute, score_order)
        except BaseException:
            self.lease.release()
            raise

    def _open(self, num_to_keep: Optional[int], score_attribute: Optional[str], score_order: str) -> None:
        """Load the index, settle what a crash left, clean leftovers (the lease is held)."""
        self.manager = CheckpointManager(self.url, num_to_keep, score_attribute, score_order)
        self.report_base = 1  # recover() below moves it past every index the run used
        self._pending: Dict[str, Dict[str, Any]] = {}  # report name -> ranks that reported it, files, metrics
        self._lock = threading.Lock()
        self.background_error: Optional[str] = None
        self.background: Optional[threading.Thread] = None  # an --async snapshot being written
        #: ``on_commit(entry, validation)`` after a reported checkpoint is committed (validation: what rank 0's
        #: report(validation=...) asked, or None); set by the validations' owner
        self.on_commit: Optional[Callable[[CheckpointEntry, Any], None]] = None
        self.validator: Any = None  # the run's validations (group/validations.py), when it has a function
        self.recover()  # what an earlier kernel or attempt left: committed if every rank reported it
        clean_leftovers(self.url)  # interrupted writes and deletes of earlier processes

    def close(self) -> None:
        """Give the run's lease back: another writer may open it now (idempotent)."""
        self.lease.release()

    def _next_report_number(self, pending: Sequence[str]) -> int:
        """One past the highest report index the run has used: committed, still in storage (``pending``), or
        logged with rank 0's metrics (reports without a checkpoint count too)."""
        used: List[Optional[int]] = [entry_report(e) for e in self.manager.list("reported")]
        used += [reported.report_index(n) for n in pending]
        try:
            used.append(last_report_index(self.url))
        except Exception as exc:  # noqa: BLE001 - the checkpoints' indices still hold
            logger.warning("cannot read the last report index from %s/metrics.jsonl: %s", self.url, exc)
        return max((i for i in used if i is not None), default=0) + 1

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
        """Append rank 0's metrics to ``metrics.jsonl``; commit a reported checkpoint once every rank of
        the ``world_size`` world reported it (with files or without)."""
        lines = [dict(r["metrics"], _time=r["time"], **_index_of(r)) for r in records if r["rank"] == 0]
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
                pending = self._pending.setdefault(key, {"ranks": set(), "files": False, "metrics": {}})
                pending["ranks"].add(rec["rank"])
                pending["files"] |= bool(rec.get("checkpoint"))
                if rec["rank"] == 0:  # rank 0's directory name is the set's (Ray Train synchronises it so)
                    pending.update(metrics=rec["metrics"], dir=rec.get("dir"), in_place=rec.get("in_place", False),
                                   validation=rec.get("validation"))
                complete = pending["ranks"] >= set(range(world_size))
                if complete:
                    del self._pending[key]
            if complete and pending["files"]:
                staged = reported.report_staging(self.url, key, pending.get("dir"), pending.get("in_place", False))
                try:
                    reported.mark_complete(staged, world_size, pending["metrics"])
                except Exception as exc:  # noqa: BLE001 - the commit below still runs; recovery would discard it
                    logger.warning("cannot record that every rank reported %s: %s", key, exc)
                validation = pending.get("validation")
                entry = self._commit(staged, pending["metrics"], {"status": "pending"} if validation else None)
                if entry is not None and self.on_commit is not None:
                    self.on_commit(entry, validation)

    def _commit(self, staged: StagedDir, metrics: Optional[Dict[str, Any]] = None,
                validation: Optional[Dict[str, Any]] = None) -> Optional[CheckpointEntry]:
        state = reported.upload_state(staged)
        if not state or any(s != "done" for s in state.values()):
            logger.warning("checkpoint %s not committed: uploads unfinished (%s)", staged.name, state)
            return None
        name = staged.final_path.rsplit("/", 1)[-1]
        try:
            if name != staged.name and any(e.name == name for e in self.manager.list()):
                raise CheckpointError(f"checkpoint_dir_name={name!r} is used already in this run")
            commit_dir(staged)
            entry = self.manager.register(name, "reported", staged.final_url, metrics or {},
                                          report=reported.report_index(staged.name), validation=validation)
        except CheckpointError as exc:
            logger.warning("checkpoint %s not committed: %s", name, exc)
            return None
        finally:
            reported.clear_markers(staged)
        logger.info("committed %s", entry.name)
        return entry

    def recover(self) -> List[str]:
        """Settle the reported checkpoints a crash left in storage; returns the names committed.

        One whose every rank reported it (the driver's ``complete`` marker, or a finished upload
        from every rank of its world) and whose uploads all finished is committed; any other is
        discarded (named in the log), never committed. Runs when a run is opened and on every
        restart; afterwards the next report index is past every index the run used.
        """
        names = reported.pending_names(self.url)
        self.report_base = max(self.report_base, self._next_report_number(names))
        with self._lock:
            self._pending.clear()  # reports of the attempt that failed: their sets are settled below
        committed = []
        done = {entry_report(e) for e in self.manager.list("reported")}
        for name in names:
            staged = reported.staging_of(self.url, name)
            if reported.report_index(name) in done:  # committed, but its markers were left behind
                reported.clear_markers(staged)
                continue
            verdict, metrics = _settle(self.url, staged)
            if verdict is None and self._commit(staged, metrics) is not None:
                committed.append(name)
                continue
            logger.warning("reported checkpoint %s discarded, not committed: %s", name,
                           verdict or "its commit failed")
            try:
                reported.discard(staged)
            except Exception as exc:  # noqa: BLE001 - the next open tries again
                logger.warning("could not remove the discarded checkpoint %s: %s", name, exc)
        reported.clear_ledgers(self.url)  # every pending set is settled: no evidence is needed any more
        return committed

    def advance(self, reports: int) -> None:
        """After a cell: the next cell numbers its reported checkpoints after this one's."""
        self.report_base += reports


def _index_of(record: Dict[str, Any]) -> Dict[str, int]:
    """``{"_report": index}`` for a record of a numbered report (``{}`` otherwise), for ``metrics.jsonl``."""
    index = reported.report_index(record.get("report") or "")
    return {} if index is None else {REPORT_KEY: index}


def _settle(run_url: str, staged: StagedDir) -> Tuple[Optional[str], Dict[str, Any]]:
    """``(None, metrics)`` when every rank reported ``staged`` (the driver's record, a finished upload
    or a ledger entry from each rank) and every upload finished, else ``(why not, {})``."""
    state = reported.upload_state(staged)
    unfinished = sorted(r for r, s in state.items() if s != "done")
    if unfinished:
        return f"rank(s) {', '.join(map(str, unfinished))} did not finish uploading it", {}
    complete = reported.complete_info(staged)
    if complete is not None:
        return None, complete.get("metrics") or reported.done_info(staged, 0)["metrics"]
    worlds = {reported.done_info(staged, r)["world_size"] for r in state}
    world = worlds.pop() if len(worlds) == 1 else 0
    index = reported.report_index(staged.name)
    ledger = reported.ledger_ranks(run_url, index, world) if world and index is not None else []
    missing = sorted(set(range(world)) - set(state) - set(ledger)) if world else []
    if world and not missing:
        return None, reported.done_info(staged, 0)["metrics"]
    who = f"rank(s) {', '.join(map(str, missing))}" if missing else "not every rank"
    return f"{who} never reported it (a rank failed before its report())", {}
