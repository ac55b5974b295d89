"""Driving a group through the Python API: one ``WorkerGroup`` in this process.

:class:`PyDriver` and :class:`~soak.driver_kernel.KernelDriver` offer the same operations, each
returning an :class:`~soak.watchdog.Outcome` (under a deadline: a call still running then is a
hang). Operations that take ``action`` call it (from this thread) ``delay_s`` seconds after the
operation started, or after ``marker`` appeared in rank 0's output: that is where faults and
interrupts are fired while the operation runs.
"""
from __future__ import annotations

import os
import threading
from typing import Any, Callable, List, Optional, Tuple

import cloudpickle

from . import digest
from .faults import during
from .watchdog import Outcome, call_with_deadline


def _by_value() -> None:
    """Pickle :mod:`soak.digest`'s functions by value: the workers cannot import the soak package (Ray
    pickles with its own copy of cloudpickle)."""
    import ray.cloudpickle

    cloudpickle.register_pickle_by_value(digest)
    ray.cloudpickle.register_pickle_by_value(digest)


_by_value()

Action = Optional[Callable[[bool], Any]]


def _sink() -> Any:
    from raytrain_nb import OutputSink

    class MarkSink(OutputSink):
        """Keeps the last output; ``event(marker)`` is set when the marker appears in rank output."""

        def __init__(self) -> None:
            self.text = ""
            self.notices: List[str] = []
            self.events: dict = {}

        def event(self, marker: str) -> threading.Event:
            return self.events.setdefault(marker, threading.Event())

        def stream(self, rank: int, name: str, text: str, label: bool) -> None:
            self.text = (self.text + text)[-4000:]
            for marker, ev in self.events.items():
                if marker in text:
                    ev.set()

        def display(self, rank: int, data: Any, metadata: Any, label: bool) -> None:
            pass

        def value(self, rank: int, data: Any, metadata: Any, label: bool) -> None:
            pass

        def notice(self, text: str) -> None:
            self.notices.append(text)

    return MarkSink()


class PyDriver:
    """A ``WorkerGroup`` in this process.

    Args:
        storage: the local folder holding the runs.
        heartbeat_s: the group's heartbeat timeout (a SIGSTOP longer than this is reported).
    """

    kind = "py"

    def __init__(self, storage: str, heartbeat_s: float) -> None:
        self.storage = storage
        self.heartbeat_s = heartbeat_s
        self.group: Any = None
        self.bg: Any = None
        self.run_name = ""

    def _do(self, fn: Callable[[], Any], deadline_s: float, label: str, action: Action = None,
            delay_s: float = 0.0, wait_for: Optional[threading.Event] = None) -> Tuple[Outcome, Any]:
        if action is None:
            return call_with_deadline(fn, deadline_s, label), None
        return during(fn, deadline_s, label, action, delay_s, wait_for)

    # -- lifecycle ----------------------------------------------------------------------------

    def start(self, workers: int, run_name: str, deadline_s: float) -> Outcome:
        from raytrain_nb import WorkerGroup

        self.run_name = run_name

        def make() -> None:
            self.group = WorkerGroup(workers, cpus_per_worker=1, storage_path=self.storage, name=run_name,
                                     heartbeat_timeout_s=self.heartbeat_s)

        return call_with_deadline(make, deadline_s, "start")

    def shutdown(self, deadline_s: float) -> Outcome:
        group, self.group = self.group, None
        return call_with_deadline(group.shutdown if group is not None else (lambda: None), deadline_s, "shutdown")

    def close(self) -> None:
        """Nothing to close: the group is shut down by :meth:`shutdown`."""

    @property
    def run_dir(self) -> str:
        return os.path.join(self.storage, self.run_name)

    # -- cells ------------------------------------------------------------------------------

    def cell(self, source: str, deadline_s: float, action: Action = None, delay_s: float = 0.0,
             marker: Optional[str] = None) -> Tuple[Outcome, Any]:
        sink = _sink()
        wait_for = sink.event(marker) if marker else None
        return self._do(lambda: self.group.run(source, sink=sink), deadline_s, "cell", action, delay_s, wait_for)

    def bg_start(self, source: str, deadline_s: float) -> Outcome:
        def go() -> None:
            self.bg = self.group.run(source, sink=_sink(), background=True)

        return call_with_deadline(go, deadline_s, "background start")

    def bg_wait(self, deadline_s: float) -> Outcome:
        bg = self.bg
        return call_with_deadline(lambda: bg.wait() if bg is not None else None, deadline_s, "background wait")

    def bg_interrupt(self, deadline_s: float) -> Outcome:
        return call_with_deadline(self.group.interrupt, deadline_s, "interrupt")

    def interrupt_action(self) -> Callable[[bool], Any]:
        """An action that interrupts the running cell (what Ctrl-C / the stop button does)."""
        return lambda running: self.group.interrupt()

    # -- state ------------------------------------------------------------------------------

    def checkpoint(self, name: str, blocking: bool, deadline_s: float, action: Action = None,
                   delay_s: float = 0.0) -> Tuple[Outcome, Any]:
        return self._do(lambda: self.group.checkpoint(name=name, blocking=blocking), deadline_s, "checkpoint",
                        action, delay_s)

    def checkpoint_written(self) -> bool:
        """Whether no ``--async`` snapshot write is still going on (a read-only look at the run storage)."""
        thread = getattr(self.group.run_storage, "background", None)
        return thread is None or not thread.is_alive()

    def rollback(self, name: str, deadline_s: float) -> Outcome:
        return call_with_deadline(lambda: self.group.rollback(name), deadline_s, "rollback")

    def restart(self, deadline_s: float, from_checkpoint: Optional[str] = None, action: Action = None,
                delay_s: float = 0.0) -> Tuple[Outcome, Any]:
        return self._do(lambda: self.group.restart(from_checkpoint=from_checkpoint), deadline_s, "restart",
                        action, delay_s)

    def rescale(self, n: int, deadline_s: float, action: Action = None, delay_s: float = 0.0) -> Tuple[Outcome, Any]:
        return self._do(lambda: self.group.rescale(n), deadline_s, "rescale", action, delay_s)

    def status(self, deadline_s: float) -> Outcome:
        """``value``: [(rank, pid, state)], pinging every worker (a death Ray knows of counts)."""
        return call_with_deadline(lambda: [(s.rank, s.pid, str(getattr(s.state, "value", s.state)))
                                           for s in self.group.status()], deadline_s, "status")

    def digests(self, deadline_s: float) -> Outcome:
        """``value``: each rank's digests of its training state (``group.execute``; a sharded model's as the digest
        of its full state, joined here from every rank's shards: :func:`~soak.digest.soak_merge`)."""
        return call_with_deadline(lambda: digest.soak_merge(self.group.execute(digest.soak_remote_digests)),
                                  deadline_s, "digests")

    def group_state(self) -> str:
        return str(getattr(self.group.state, "value", self.group.state)) if self.group is not None else "none"

    def size(self) -> int:
        return self.group.num_workers if self.group is not None else 0

    def known_pids(self) -> List[int]:
        """The pids of the ranks as last known, without asking the workers (safe while a step runs)."""
        return [s.pid for s in self.group.status(ping=False)] if self.group is not None else []

    def driver_pid(self) -> int:
        return os.getpid()
