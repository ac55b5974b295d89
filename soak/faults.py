"""Faults: SIGKILL, or SIGSTOP then SIGCONT, of a worker process, fired from the soak's main thread
while an operation runs in another (see :func:`during`).

Only worker processes of the soak's own groups are signalled, by pid (from the group's status or
Ray's actor table); every process left stopped is continued at the end of the step.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Set

from .watchdog import Outcome, call_with_deadline

_stopped: Set[int] = set()
_lock = threading.Lock()


@dataclasses.dataclass
class Fired:
    """A fault that was fired.

    Attributes:
        kind: ``kill`` or ``stop``.
        pid: the process signalled.
        at: seconds after the operation started.
        during: the operation was still running when the fault fired.
        stop_s: for ``stop``: how long the process stayed stopped.
    """

    kind: str
    pid: int
    at: float
    during: bool
    stop_s: float = 0.0


def _cont(pid: int) -> None:
    with _lock:
        if pid not in _stopped:
            return
        _stopped.discard(pid)
    try:
        os.kill(pid, signal.SIGCONT)
    except ProcessLookupError:
        pass


def fire(kind: str, pid: int, stop_s: float = 0.0) -> bool:
    """SIGKILL ``pid`` (``kind="kill"``), or SIGSTOP it and SIGCONT it ``stop_s`` seconds later.

    Returns:
        False when the process was already gone.
    """
    try:
        if kind == "kill":
            os.kill(pid, signal.SIGKILL)
        else:
            os.kill(pid, signal.SIGSTOP)
            with _lock:
                _stopped.add(pid)
            timer = threading.Timer(stop_s, _cont, args=(pid,))
            timer.daemon = True
            timer.start()
        return True
    except ProcessLookupError:
        return False


def continue_all() -> None:
    """SIGCONT every process this module stopped and has not continued yet."""
    with _lock:
        pids = list(_stopped)
    for pid in pids:
        _cont(pid)


def still_stopped() -> List[int]:
    with _lock:
        return sorted(_stopped)


def during(op: Callable[[], Any], deadline_s: float, label: str, action: Callable[[bool], Any],
           delay_s: float, wait_for: Optional[threading.Event] = None) -> "tuple[Outcome, Any]":
    """Run ``op`` in a thread under ``deadline_s``; call ``action(running)`` from this thread ``delay_s``
    seconds after ``op`` started (after ``wait_for`` is set, when given, at most 30 s). ``running`` tells
    whether ``op`` was still running then. The action fires a fault or interrupts the group.

    Returns:
        The operation's :class:`Outcome` and what ``action`` returned.
    """
    result: Dict[str, Outcome] = {}
    done = threading.Event()

    def run() -> None:
        result["o"] = call_with_deadline(op, deadline_s, label)
        done.set()

    threading.Thread(target=run, name=f"soak-during-{label}", daemon=True).start()
    if wait_for is not None:
        for _ in range(300):  # the marker, or the op ending first
            if wait_for.wait(0.1) or done.is_set():
                break
    done.wait(delay_s)
    acted = action(not done.is_set())
    done.wait(deadline_s + 5)
    return result.get("o") or Outcome(ok=False, error_type="Hang", message=f"{label} never returned",
                                      named=False, hung=True, elapsed=deadline_s), acted


def fault_action(kind: str, victim: Callable[[], Optional[int]], stop_s: float, started: float
                 ) -> Callable[[bool], Optional[Fired]]:
    """An action for :func:`during` that fires ``kind`` at ``victim()``."""

    def act(running: bool) -> Optional[Fired]:
        pid = victim()
        if pid and fire(kind, pid, stop_s):
            return Fired(kind, pid, time.monotonic() - started, running, stop_s)
        return None

    return act
