"""Checkpoint methods of the worker actor (a mixin of :class:`~.worker.Worker`): snapshots and reported checkpoints."""
from __future__ import annotations

import concurrent.futures
import logging
import threading
from typing import Any, Callable, Dict, List, Optional, Sequence, Set

from ..checkpoint import reported
from ..checkpoint.manager import CheckpointManager
from ..checkpoint.staging import StagedDir
from ..checkpoint.storage_check import read_marker
from ..errors import CheckpointError
from . import snapshot_io
from . import upload_plan as uploads_plan
from .copy_pool import CopyPool
from .snapshot import check_capturable, find_tracked, tensors_of
from .report_api import ReportOptions
from .session import get_context
from .uploads import UploadQueue

logger = logging.getLogger(__name__)


class CheckpointingWorker:
    """Snapshots of the warm state, rollback, and uploads of reported checkpoints."""

    namespace: Dict[str, Any]
    rank: int
    session: Any
    _cells: Any

    def _init_checkpointing(self) -> None:
        self._run_url: Optional[str] = None
        self._report_base = 0
        self._partial = False  # the running cell runs on some ranks only: no reported checkpoints
        self._ledger: Optional[reported.ReportLedger] = None  # this rank's record of its reports
        self._dir_names: Set[str] = set()  # checkpoint_dir_name values this rank used in this cell (or attempt)
        self._names_base = -1  # the report base of the cell they were used in
        self._snap_lock = threading.Lock()
        self._snap_future: Optional["concurrent.futures.Future[Dict[str, Any]]"] = None
        self._snap_request: Optional[tuple] = None
        self._copy_pool = CopyPool()  # the last background snapshot's buffers, for the next one's copy
        self._validation = False  # the trainer or group has a validation function
        self.uploads = UploadQueue()  # report(checkpoint_upload_mode=ASYNC)'s background uploads

    def _attach_session(self) -> None:
        """Point the session's report/get_checkpoint at this worker's storage."""
        if self.session is not None and self._run_url is not None:
            self.session.upload = self._upload
            self.session.report_name = self.report_name
            self.session.latest = self._latest
            self.session.on_report = self._on_report
            self.session.prepare_upload = self._prepare_upload
            self.session.uploads = self.uploads
            self.session.reported = self._reported
            self.session.has_validation = self._validation
        if self._run_url is not None and self.rank >= 0 and (self._ledger is None or self._ledger.rank != self.rank):
            if self._ledger is not None:
                self._ledger.close()
            self._ledger = reported.ReportLedger(self._run_url, self.rank)  # per rank: rescale may change it

    def set_storage(self, run_url: Optional[str], validation: bool = False) -> None:
        """The run directory reported checkpoints go to; ``validation``: the group validates them (a function)."""
        if run_url != self._run_url:
            self._dir_names = set()
        self._run_url, self._validation = run_url, validation
        self._attach_session()

    def _upload(self, index: int, checkpoint: Any, metrics: Dict[str, Any]) -> None:
        self._prepare_upload(index, checkpoint, metrics, None)()

    def _prepare_upload(self, index: int, checkpoint: Any, metrics: Dict[str, Any],
                        options: Optional[ReportOptions]) -> Callable[[], Dict[str, Any]]:
        """Check a report's checkpoint options now; return the upload (``job() -> the record's fields``)."""
        if self._partial:
            raise RuntimeError("report(checkpoint=...) needs every rank: this cell runs on some ranks only "
                               "(--ranks / ranks=); run it on the whole group")
        if self._names_base != self._report_base:  # a new cell or attempt: earlier names are directories by now
            self._dir_names, self._names_base = set(), self._report_base
        return uploads_plan.plan(self._run_url, self.report_name(index), self.rank, get_context().get_world_size(),
                                 checkpoint, metrics, options, self._dir_names)

    def _reported(self, mode: Any, timeout_s: Optional[float]) -> List[Any]:
        """``get_all_reported_checkpoints``: wait for this rank's reports to settle (and their validations)."""
        self.uploads.wait()  # no deadline: this rank's own uploads come first, as in report order
        last = self._report_base + self.session.reports_this_cell - 1  # this rank's last report (< base: none)
        return uploads_plan.reported_checkpoints(self._run_url, last, mode, timeout_s)

    def report_name(self, index: int) -> str:
        """The name the ``index``-th report of the running cell gives its checkpoint."""
        return reported.report_name(self._report_base + index)

    def _latest(self) -> Any:

        try:
            entry = CheckpointManager.load(self._run_url).latest("reported")
        except CheckpointError:
            return None
        return entry.checkpoint if entry is not None else None

    # -- snapshots ---------------------------------------------------------------------------

    def snapshot(self, staged: StagedDir, var_names: Sequence[str], background: bool) -> Dict[str, Any]:
        """Snapshot now (between cells). With ``background``, return at once: the copy is the next call of the
        cell thread (so no cell runs before it is taken) and the write a thread of its own."""
        if not background:
            return self._cells.call(self._snapshot, staged, tuple(var_names))
        # what the copy would raise, the user sees now, not after the next cell
        check_capturable(self.namespace, var_names, shared=self.rank == 0)
        fut: "concurrent.futures.Future[Dict[str, Any]]" = concurrent.futures.Future()
        with self._snap_lock:
            self._snap_future = fut
        self._cells.submit(self._take_in_background, staged, tuple(var_names), fut)
        return {"rank": self.rank, "sharded": bool(find_tracked(self.namespace, strict=False).sharded)}

    def _snapshot(self, staged: StagedDir, var_names: Sequence[str]) -> Dict[str, Any]:
        world = self.session.context.world_size if self.session is not None else 1
        # Between cells nothing changes the state before it is written: no copy
        taken = snapshot_io.take(self.namespace, self.rank, world, var_names, copy=False)
        snapshot_io.write(taken, staged)
        return {"rank": self.rank, "sharded": bool(taken["sharded"])}

    def _take_in_background(self, staged: StagedDir, var_names: Sequence[str],
                            fut: "concurrent.futures.Future[Dict[str, Any]]") -> None:
        """On the cell thread: copy the state now (into the pool's buffers), write it in a thread."""
        try:
            world = self.session.context.world_size if self.session is not None else 1
            taken = snapshot_io.take(self.namespace, self.rank, world, var_names, pool=self._copy_pool)
        except BaseException as exc:  # noqa: BLE001 - handed to snapshot_wait
            fut.set_exception(exc)
            return
        threading.Thread(target=self._write, args=(taken, staged, fut), name="rtnb-snapshot", daemon=True).start()

    def _write(self, taken: Dict[str, Any], staged: StagedDir,
               fut: "concurrent.futures.Future[Dict[str, Any]]") -> None:
        """Write a taken copy; once written, its buffers are the spares the next copy goes into."""
        try:
            snapshot_io.write(taken, staged)
            self._copy_pool.refill(tensors_of(taken["replicated"]))
            fut.set_result({"rank": self.rank})
        except BaseException as exc:  # noqa: BLE001 - handed to snapshot_wait
            fut.set_exception(exc)

    def request_snapshot(self, staged: StagedDir, var_names: Sequence[str]) -> None:
        """Snapshot at the next ``report()`` of the running cell (a step boundary), or when it ends."""
        with self._snap_lock:
            self._snap_future = concurrent.futures.Future()
            self._snap_request = (staged, tuple(var_names))

    def cancel_snapshot(self) -> None:
        with self._snap_lock:
            self._snap_request = None

    def _on_report(self, index: int, ledger_only: bool = False, step_only: bool = False) -> None:
        """After the ``index``-th report of the running cell is queued, before ``report()`` returns.

        The ledger's append is the evidence that this rank reached that report index: it is written
        here, on the caller's thread, so a SIGKILL right after ``report()`` returned cannot lose it.
        A report whose record waits for an upload (ASYNC) writes it only once uploaded (``ledger_only``, on the
        uploads' thread): killed before, the rank never reported it, and its set is discarded.
        """
        if self._ledger is not None and not step_only:
            self._ledger.add(self._report_base + index)  # survives this process: evidence that it reported
        if ledger_only:
            return
        if self._snap_request is not None:  # unlocked look first: set under the lock, seen at this report or the next
            self._take_requested()

    def _take_requested(self) -> None:
        with self._snap_lock:
            request, self._snap_request = self._snap_request, None
            fut = self._snap_future
        if request is None or fut is None:
            return
        staged, var_names = request
        self._take_in_background(staged, var_names, fut)  # on the training thread, paused in report()

    def snapshot_wait(self, timeout: Optional[float] = None) -> Dict[str, Any]:
        """Wait for this rank's snapshot files to be written (re-raises a write error)."""
        with self._snap_lock:
            fut = self._snap_future
        if fut is None:
            raise RuntimeError("no snapshot was asked of this worker")
        try:
            return fut.result(timeout)
        except concurrent.futures.TimeoutError:
            return {"rank": self.rank, "timeout": True}

    def rollback(self, url: str, allow_pickle: bool = False, files: Optional[Dict[str, int]] = None,
                 meta: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Load a snapshot into this rank's namespace, in place (``files``, ``meta``: its files as the driver checked
        them and its ``snapshot.json`` as the driver read it)."""
        return self._cells.call(snapshot_io.load, self.namespace, url, self.rank, allow_pickle, "roll back", files,
                                meta)

    # The driver's path: each method's arguments in one list. Ray carries one argument for about the cost of each of
    # four (100-120 us of a rank's CPU apiece, measured at 8 ranks), and the same list goes to every rank.

    def snapshot_packed(self, request: Sequence[Any]) -> Dict[str, Any]:
        """:meth:`snapshot` with ``[staged, var_names, background]``."""
        return self.snapshot(*request)

    def rollback_packed(self, request: Sequence[Any]) -> Dict[str, Any]:
        """:meth:`rollback` with ``[url, allow_pickle, files, meta]``."""
        return self.rollback(*request)

    def load_state_packed(self, request: Sequence[Any]) -> Dict[str, Any]:
        """``Worker.load_state`` with ``[url, allow_pickle, files, meta]``."""
        return self.load_state(*request)  # type: ignore[attr-defined]  # the Worker's own


def read_storage_marker(url: str, token: str) -> None:
    """On a worker: read the driver's marker in the run directory, write this rank's."""
    read_marker(url, token, rank=get_context().get_world_rank())
