"""Dropping stale button clicks: a click must never act long after it was made.

A Jupyter kernel handles one request at a time. A click on a dashboard button while a plain
(foreground) cell runs is queued and would run only after that cell, e.g. a Shut down clicked
mid-training would stop the workers minutes later. The dashboard disables its buttons during
foreground ``%%distributed`` cells, but a click can still be queued: one sent just before the
buttons turned grey, or while a ``%%distributed`` cell waited behind another cell.

:class:`ClickGuard` records the kernel's busy stretches (every cell, and every button action) in
the kernel's clock. A click is *stale* when it was sent before the end of a busy stretch and is
handled after it: it waited in the queue. When it was sent is known from the message header's
``date`` (the front end's clock), converted to the kernel's clock with an offset learnt from
requests the kernel handled at once: ``offset = min(received - date)`` per client session. That
estimate can only be too large by the fastest delivery time seen (milliseconds), so a click made
after a busy stretch ended is never dropped. A message without a date counts as stale when a busy
stretch ended less than ``NO_DATE_GRACE_S`` before it is handled.
"""
from __future__ import annotations

import collections
import contextlib
import datetime
import threading
import time
from typing import Any, Deque, Dict, Iterator, Optional, Tuple

from ..routing import current_parent

NO_DATE_GRACE_S = 1.0
WINDOWS_KEPT = 256


def _epoch(date: Any) -> Optional[float]:
    if isinstance(date, datetime.datetime):
        if date.tzinfo is None:
            date = date.replace(tzinfo=datetime.timezone.utc)
        return date.timestamp()
    if isinstance(date, str) and date:
        try:
            return _epoch(datetime.datetime.fromisoformat(date.replace("Z", "+00:00")))
        except ValueError:
            return None
    return None


class ClickGuard:
    """Busy stretches of the kernel and the clock offsets of its clients (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._windows: Deque[Tuple[float, float]] = collections.deque(maxlen=WINDOWS_KEPT)
        self._depth = 0
        self._since = 0.0
        self._offsets: Dict[str, float] = {}

    # -- learning ----------------------------------------------------------------------------

    def sample(self, msg: Optional[Dict[str, Any]], now: Optional[float] = None) -> None:
        """Learn a client's clock offset from a request the kernel handles now."""
        header = (msg or {}).get("header") or {}
        sent = _epoch(header.get("date"))
        if sent is None:
            return
        offset = (time.time() if now is None else now) - sent
        session = str(header.get("session", ""))
        with self._lock:
            if offset < self._offsets.get(session, float("inf")):
                self._offsets[session] = offset

    def begin(self, now: Optional[float] = None) -> None:
        """The kernel became busy (a cell or a button action started)."""
        with self._lock:
            if self._depth == 0:
                self._since = time.time() if now is None else now
            self._depth += 1

    def end(self, now: Optional[float] = None) -> None:
        """The busy stretch that :meth:`begin` started ended."""
        with self._lock:
            if self._depth == 0:
                return
            self._depth -= 1
            if self._depth == 0:
                self._windows.append((self._since, time.time() if now is None else now))

    @contextlib.contextmanager
    def busy(self) -> Iterator[None]:
        self.begin()
        try:
            yield
        finally:
            self.end()

    # -- judging -----------------------------------------------------------------------------

    def stale(self, msg: Optional[Dict[str, Any]], now: Optional[float] = None) -> bool:
        """Whether the click carried by ``msg`` (the kernel's current request) waited behind a busy stretch.

        A click that did not come from a front end (``Button.click()`` in code or a test, where
        the current request is not a ``comm_msg``) is never stale.
        """
        if not msg or (msg.get("header") or {}).get("msg_type") != "comm_msg":
            return False
        now = time.time() if now is None else now
        header = msg["header"]
        sent = _epoch(header.get("date"))
        with self._lock:
            offset = self._offsets.get(str(header.get("session", "")))
            if offset is None and self._offsets:
                offset = min(self._offsets.values())  # another tab of the same browser, most likely
            windows = list(self._windows)
        if sent is None or offset is None:
            return any(0 <= now - end < NO_DATE_GRACE_S for _, end in windows)
        sent_here = sent + offset
        return any(sent_here < end <= now for _, end in windows)


_GUARD: Optional[ClickGuard] = None
_GUARD_LOCK = threading.Lock()


def click_guard() -> ClickGuard:
    """The kernel's guard; the first call hooks it to IPython's cell events (inside a kernel)."""
    global _GUARD
    with _GUARD_LOCK:
        if _GUARD is None:
            _GUARD = ClickGuard()
            _hook(_GUARD)
        return _GUARD


def _hook(guard: ClickGuard) -> None:

    try:
        from IPython import get_ipython  # IPython: only inside a kernel
    except ImportError:  # pragma: no cover
        return
    shell = get_ipython()
    if shell is None or getattr(shell, "kernel", None) is None:
        return

    def pre(*_: Any) -> None:
        guard.sample(current_parent())
        guard.begin()

    def post(*_: Any) -> None:
        guard.end()

    shell.events.register("pre_run_cell", pre)
    shell.events.register("post_run_cell", post)
