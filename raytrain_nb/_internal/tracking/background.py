"""A tracker's calls, in order, on one daemon thread: the caller only appends to a bounded queue.

Training never waits for a tracking server. A call that fails is retried in the background (waits doubling from
:data:`FIRST_RETRY_S` to :data:`MAX_RETRY_S`) and the trouble is named once, in a warning, until the server
answers again; a call the server refuses for good (:class:`Rejected`, or what ``permanent(exc)`` says) is dropped
with a warning instead of retried. When the queue holds :data:`CAPACITY` calls, new ones are dropped and counted
(named once). After :meth:`BackgroundLog.close` the thread goes on trying for :data:`LINGER_S` seconds at most;
at interpreter exit every open log gets :data:`EXIT_WAIT_S` seconds in all to finish.
"""
from __future__ import annotations

import atexit
import collections
import logging
import threading
import time
import weakref
from typing import Any, Callable, Deque, Optional, Tuple

logger = logging.getLogger(__name__)

#: Calls waiting at most (a server down for a long run drops the newest beyond this, counted).
CAPACITY = 20_000
#: A call running this long is named as slow (once), from the next caller's thread: the cell's.
SLOW_S = 10.0
FIRST_RETRY_S = 0.5
MAX_RETRY_S = 30.0
#: After close, how long the thread still tries to log what waits before it gives up (naming what it dropped).
LINGER_S = 300.0
#: At interpreter exit, how long all open logs together may take to finish.
EXIT_WAIT_S = 10.0

Call = Tuple[Callable[..., Any], Tuple[Any, ...], str]
THREAD_NAME = "rtnb-tracking"
#: Loggers whose retry messages on the tracking thread are not shown (the log names the trouble once itself).
QUIET_LOGGERS = ("urllib3.connectionpool",)


class _OffTheTrackingThread(logging.Filter):
    """Drops records logged on a tracking thread (an HTTP client's every retry of a server that is down)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return record.threadName != THREAD_NAME


_QUIET = _OffTheTrackingThread()


class Rejected(Exception):
    """The tracker refused a call for good (a bad value, a changed parameter): dropped, not retried."""


class BackgroundLog:
    """Runs submitted calls in order on a daemon thread, retrying failures, never blocking the caller.

    Args:
        what: names the destination in messages (``"MLflow at http://..."``); :attr:`what` may be set later.
        permanent: ``permanent(exc)`` is True for an error that retrying cannot fix.
        capacity, slow_s: see :data:`CAPACITY`, :data:`SLOW_S`.
    """

    def __init__(self, what: str, permanent: Callable[[BaseException], bool] = lambda exc: False,
                 capacity: Optional[int] = None, slow_s: Optional[float] = None) -> None:
        self.what = what
        self.permanent = permanent
        self.capacity = CAPACITY if capacity is None else capacity
        self.slow_s = SLOW_S if slow_s is None else slow_s
        self.dropped = 0
        self.failed_calls = 0
        self.last_error: Optional[str] = None
        self._items: Deque[Call] = collections.deque()
        self._cond = threading.Condition()
        self._wake = threading.Event()
        self._busy_since: Optional[float] = None
        self._closing = False
        self._stop_by: Optional[float] = None
        self._down = False
        self._named = False  # the current trouble (down or slow) was named
        self._named_full = False
        self._refused: set = set()
        for name in QUIET_LOGGERS:
            if _QUIET not in logging.getLogger(name).filters:
                logging.getLogger(name).addFilter(_QUIET)
        self._thread = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
        self._thread.start()
        _OPEN.add(self)

    # -- the caller's side (the cell's or the trainer's thread): appends, never waits -----------------

    def submit(self, fn: Callable[..., Any], *args: Any, label: str = "", force: bool = False) -> bool:
        """Queue ``fn(*args)``; False when it was dropped (the queue is full, or the log is closed)."""
        self.name_if_slow()
        with self._cond:
            if self._closing and not force:
                return False
            if len(self._items) >= self.capacity and not force:
                self.dropped += 1
                first, self._named_full = not self._named_full, True
            else:
                self._items.append((fn, args, label or getattr(fn, "__name__", "call")))
                self._cond.notify_all()
                return True
        if first:
            logger.warning("%s: %d calls wait already; newer reports are not logged (counted in .dropped) until "
                           "it catches up", self.what, self.capacity)
        return False

    def name_if_slow(self) -> None:
        """Name a call running past ``slow_s`` (once per trouble), from the caller's thread."""
        since = self._busy_since
        if since is not None and not self._named and time.monotonic() - since > self.slow_s:
            self._named = True
            logger.warning("%s has not answered for %.0f s: training goes on; what it should log waits and is "
                           "sent in the background", self.what, time.monotonic() - since)

    @property
    def pending(self) -> int:
        """Calls not done yet (the one running included)."""
        with self._cond:
            return len(self._items)

    @property
    def healthy(self) -> bool:
        """False while the destination fails or is slow to answer."""
        since = self._busy_since
        return not self._down and (since is None or time.monotonic() - since <= self.slow_s)

    def flush(self, timeout_s: float, while_healthy: bool = False) -> bool:
        """Wait up to ``timeout_s`` for every queued call to be done (``while_healthy``: only while the destination
        answers in time); True when they are."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._items:
                left = deadline - time.monotonic()
                if left <= 0 or not self._thread.is_alive() or (while_healthy and not self.healthy):
                    return False
                self._cond.wait(min(left, 0.2))
        return True

    def close(self, wait_s: float = 0.0) -> bool:
        """No more calls; wait up to ``wait_s`` for the queued ones while the destination answers (a destination
        that is down costs nothing: the thread goes on for :data:`LINGER_S` in the background). True when done."""
        with self._cond:
            self._closing = True
            self._stop_by = time.monotonic() + LINGER_S
            self._cond.notify_all()
        return self.flush(wait_s, while_healthy=True) if wait_s > 0 else not self._items

    # -- the thread --------------------------------------------------------------------------------

    def _loop(self) -> None:
        while True:
            with self._cond:
                while not self._items:
                    if self._closing:
                        return
                    self._cond.wait(0.5)
                fn, args, label = self._items[0]
            if not self._run(fn, args, label):
                self._give_up()
                return
            with self._cond:
                self._items.popleft()
                self._cond.notify_all()

    def _run(self, fn: Callable[..., Any], args: Tuple[Any, ...], label: str) -> bool:
        """One call until it succeeds or is refused for good; False once the log gave up after close."""
        delay = FIRST_RETRY_S
        while True:
            self._busy_since = time.monotonic()
            try:
                fn(*args)
            except Exception as exc:  # noqa: BLE001 - every failure is retried or named; none reaches training
                if isinstance(exc, Rejected) or self.permanent(exc):
                    if label not in self._refused:
                        self._refused.add(label)
                        logger.warning("%s refused %s: %s (not retried; later calls of this kind are still tried)",
                                       self.what, label, _short(exc))
                    return True
                self.failed_calls += 1
                self.last_error = _short(exc)
                if not self._named:
                    self._named = True
                    logger.warning("%s cannot be reached (%s): training goes on; retrying in the background",
                                   self.what, self.last_error)
                self._down = True
            else:
                if self._down or self._named:
                    logger.warning("%s answers again: logging what waited", self.what)
                self._down = self._named = False
                return True
            finally:
                self._busy_since = None
            if self._stop_by is not None and time.monotonic() > self._stop_by:
                return False
            self._wake.wait(delay)
            delay = min(delay * 2, MAX_RETRY_S)

    def _give_up(self) -> None:
        with self._cond:
            lost, self._items = len(self._items), collections.deque()
            self._cond.notify_all()
        logger.warning("%s: %d call(s) not logged: it did not answer within %.0f s after the run ended (%s)",
                       self.what, lost, LINGER_S, self.last_error)


def _short(exc: BaseException) -> str:
    text = str(exc).strip().split("\n")[0]
    return f"{type(exc).__name__}: {text[:300]}" if text else type(exc).__name__


_OPEN: "weakref.WeakSet[BackgroundLog]" = weakref.WeakSet()


def _finish_at_exit() -> None:
    deadline = time.monotonic() + EXIT_WAIT_S
    for log in list(_OPEN):
        if log.pending:
            log.flush(max(0.0, deadline - time.monotonic()), while_healthy=True)


atexit.register(_finish_at_exit)
