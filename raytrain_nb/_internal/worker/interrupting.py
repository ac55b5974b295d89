"""Entering and leaving user code, and interrupting it: a part of :class:`~.actor.Worker`.

An interrupt raises ``KeyboardInterrupt`` in the cell thread only while it runs user code (never in ours), breaks
the rank's process group when the code stays blocked in C (a collective), and cancels the driver's cell when it
has not begun on this rank (it waits behind another call).
"""
from __future__ import annotations

import ctypes
import sys
import threading
import traceback
from typing import Any, Callable, Dict, Optional

from .collective import release_waiting
from .framework import release_current


class InterruptingWorker:
    """User code's entry and exit, ``interrupt``, ``release`` and ``stack`` (a part of :class:`~.actor.Worker`)."""

    rank: int
    pg: Any
    uploads: Any
    _cells: Any
    _lock: threading.Lock
    _done: threading.Event
    _in_user: bool
    _interrupt_pending: bool
    _interrupted: bool
    _breaking: bool
    _entered_cell: int
    _sent_cell: Optional[int]
    _cancel_upto: int

    def _enter_user(self) -> None:
        with self._lock:
            sent, self._sent_cell = self._sent_cell, None
            if sent is not None:
                if sent <= self._cancel_upto:  # interrupted before its code began (it waited behind another call)
                    self._interrupted = True
                    raise KeyboardInterrupt
                self._entered_cell = sent
            self._in_user = True
            self._interrupt_pending = False

    def _leave_user(self) -> None:
        # An interrupt aimed at user code must never fire in ours: clear it if pending.
        while True:
            try:
                with self._lock:
                    self._in_user = False
                    if self._interrupt_pending:
                        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(self._cells.ident), None)
                        self._interrupt_pending = False
                return
            except KeyboardInterrupt:
                continue

    def _call_user(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run user code; its background checkpoint uploads finish inside (a failed one is the code's error)."""
        self._enter_user()
        try:
            value = fn(*args)
            self.uploads.finish()
            return value
        finally:
            while True:
                try:
                    self._leave_user()
                    break
                except KeyboardInterrupt:
                    continue

    def release(self) -> bool:
        """Break this rank's process group (and a framework backend's collective) so peers blocked in a
        collective fail at once."""
        released = release_current()
        waited = release_waiting()
        return self.pg.break_() or released or waited

    def stack(self) -> str:
        """The Python stack of the cell thread."""
        frame = sys._current_frames().get(self._cells.ident)
        return "".join(traceback.format_stack(frame)) if frame is not None else ""

    def interrupt(self, grace_s: float = 0.3, release_wait_s: float = 1.2,
                  cell_id: Optional[int] = None) -> Dict[str, Any]:
        """Raise KeyboardInterrupt in the running user code; release it if blocked in C. ``cell_id``: the driver's
        cell running now; when it has not begun here (it waits behind another call, such as the end of a failed
        formation), it is cancelled: it ends with KeyboardInterrupt as it begins, running none of its code.

        Returns:
            ``{"state": "idle"|"finishing"|"cancelled"|"stopped"|"released"|"stuck", "stack": ...}``.
        """
        with self._lock:
            if not self._in_user:
                if cell_id is not None and cell_id > self._entered_cell:
                    self._cancel_upto = max(self._cancel_upto, cell_id)
                    return {"rank": self.rank, "state": "cancelled"}
                return {"rank": self.rank, "state": "idle" if self._done.is_set() else "finishing"}
            ctypes.pythonapi.PyThreadState_SetAsyncExc(
                ctypes.c_ulong(self._cells.ident), ctypes.py_object(KeyboardInterrupt)
            )
            self._interrupt_pending = True
            self._interrupted = True
        if self._done.wait(grace_s):
            return {"rank": self.rank, "state": "stopped"}
        # Still running: probably blocked in a C call such as a collective. Broken only while the cell is still in
        # user code (checked under the lock the cell takes to leave it), and the cell's outcome says so even when it
        # ends before the break is done: the driver never keeps a group this break has broken since.
        with self._lock:
            breaking = self._in_user
            self._breaking = self._breaking or breaking
        broke = breaking and self.pg.break_()
        if self._done.wait(release_wait_s):
            return {"rank": self.rank, "state": "released" if broke else "stopped"}
        return {"rank": self.rank, "state": "stuck", "stack": self.stack()}
