"""A rank's background checkpoint uploads (``report(checkpoint_upload_mode=ASYNC)``): one at a time, in report
order; a failed upload is raised into the training thread at once, as Ray Train does."""
from __future__ import annotations

import collections
import concurrent.futures
import ctypes
import logging
import threading
from typing import Any, Callable, Deque, List, Optional

from ..errors import CheckpointUploadError, describe

logger = logging.getLogger(__name__)

#: How long the end of a cell that failed waits for an upload still running (it is abandoned after).
ABANDON_WAIT_S = 600.0


def raise_in_thread(thread_id: int, message: str) -> bool:
    """Raise :class:`CheckpointUploadError` (with ``message``) in thread ``thread_id`` at its next bytecode."""
    CheckpointUploadError.messages[thread_id] = message
    done = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(CheckpointUploadError))
    return done == 1


class UploadQueue:
    """Jobs (an upload, then the report's record) run on one thread, in the order submitted.

    While a cell or training function runs, the thread that submitted a job is its target: a job that fails
    raises :class:`CheckpointUploadError` there (it lands at the thread's next Python bytecode). :meth:`finish`
    ends the user's part: it waits for every job and raises a failure the thread has not seen;
    :meth:`abandon` (the cell failed anyway) waits, and forgets failures.
    """

    def __init__(self) -> None:
        self._pool: Optional[concurrent.futures.ThreadPoolExecutor] = None
        self._futures: Deque["concurrent.futures.Future[Any]"] = collections.deque()
        self._lock = threading.Lock()
        self._target: Optional[int] = None
        self._error: Optional[str] = None
        #: names of the checkpoints being uploaded now or waiting to be (oldest first), for the driver's view
        self.in_flight: List[str] = []

    def busy(self) -> bool:
        """Whether a job is still queued or running."""
        while self._futures and self._futures[0].done():
            self._futures.popleft()
        return bool(self._futures)

    def submit(self, job: Callable[[], None], name: str = "") -> "concurrent.futures.Future[Any]":
        """Run ``job`` after every job submitted before it; its failure is raised into the calling thread."""
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="rtnb-upload")
        with self._lock:
            self._target = threading.get_ident()
            if name:
                self.in_flight.append(name)
        fut = self._pool.submit(self._run, job, name)
        self._futures.append(fut)
        return fut

    def _run(self, job: Callable[[], None], name: str) -> None:
        try:
            job()
        except BaseException as exc:  # noqa: BLE001 - raised into the training thread
            message = (f"the background upload of checkpoint {name or '(no name)'} failed: {describe(exc)} "
                       "(report(checkpoint_upload_mode=ASYNC)); training stops here, as in Ray Train")
            logger.error("%s", message)
            with self._lock:
                if self._error is None:
                    self._error = message
                    if self._target is not None:
                        raise_in_thread(self._target, message)
        finally:
            with self._lock:
                if name and name in self.in_flight:
                    self.in_flight.remove(name)

    def wait(self, timeout: Optional[float] = None) -> None:
        """Wait for every job submitted so far (re-raising nothing)."""
        for fut in list(self._futures):
            try:
                fut.result(timeout)
            except concurrent.futures.TimeoutError:
                logger.warning("a checkpoint upload still runs after %.0f s: the cell ends without its record",
                               timeout or 0)
                return

    def finish(self) -> None:
        """The user's code returned: wait for every job; raise a failure the training thread has not seen.

        Raises:
            CheckpointUploadError: an upload failed and nothing raised it yet.
        """
        try:
            self.wait()  # no deadline: the user's own uploads, as a SYNC report would wait for them
        finally:
            with self._lock:
                self._target, error, self._error = None, self._error, None
        CheckpointUploadError.messages.pop(threading.get_ident(), None)
        if error is not None:
            raise CheckpointUploadError(error)

    def abandon(self) -> None:
        """The cell failed or ended otherwise: no failure is raised any more; wait for a job still running."""
        with self._lock:
            self._target, self._error = None, None
        self.wait(ABANDON_WAIT_S)
        with self._lock:
            self._error = None
        CheckpointUploadError.messages.pop(threading.get_ident(), None)
