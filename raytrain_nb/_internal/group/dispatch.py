"""Waiting for a cell on every rank: stream output, release ranks left in a collective, interrupt.

While ranks run, their output and metrics are polled on the control channel
every ``POLL_INTERVAL_S``. When a rank fails while others still run, the
failed rank's process group is broken so peers blocked in a collective with
it fail at once. A KeyboardInterrupt in the driver interrupts every rank; a
rank still running ``INTERRUPT_WAIT_S`` later is named with its stack, and a
second interrupt replaces it.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Sequence, Set

from ..errors import RankFailure
from ..output import OutputSink, route
from ..waits import wait_within
from ..worker import framework as frameworks
from ..worker.outcome import CellOutcome
from . import timing
from .monitor import death_cause
from .slots import Slot
from .state import SlotState

logger = logging.getLogger(__name__)


def _died(rank: int, slot: Slot, cause: str, kind: str = "WorkerDiedError") -> CellOutcome:
    info = slot.info
    verb = "died" if kind == "WorkerDiedError" else "stopped responding"
    message = f"the worker process of rank {rank} (pid {info.get('pid')}, node {info.get('node_ip')}) {verb}: {cause}"
    failure = RankFailure(rank, kind, message, f"{kind}: {message}", node=str(info.get("node_ip", "")))
    return CellOutcome.died(rank, failure)


class Dispatch:
    """One cell (or function call) in flight on some ranks."""

    def __init__(self, group: Any, refs: Dict[Any, int], sink: OutputSink, mode: str,
                 shown: Sequence[int]) -> None:
        self.group = group
        self.pending: Dict[Any, int] = dict(refs)
        self.sink = sink
        self.mode = mode
        self.shown = list(shown)
        self.results: Dict[int, CellOutcome] = {}
        self.released: Set[int] = set()
        self.interrupts = 0
        self._stuck_deadline = 0.0
        self._released_at = 0.0  # when the first rank was released after a peer failed
        self._peers_released = False
        backend = frameworks.find(getattr(getattr(group, "config", None), "framework", None))
        # a framework backend's collective (C++) cannot be released: ranks left in it are stopped after this long
        self._stop_after_s = backend.stop_after_peer_failure_s if backend is not None else None

    def collect(self) -> Dict[int, CellOutcome]:
        while True:
            try:  # the loop's own check inside the try too: a Ctrl-C landing there is no less an interrupt
                while self.pending:
                    self._step(timing.POLL_INTERVAL_S)
                    self._check_stuck()
                    self._stop_left_in_collective()
                return self.results
            except KeyboardInterrupt:
                self.interrupts += 1
                if self.interrupts == 1:
                    self._interrupt()
                else:
                    self._replace_stuck()

    def _slot(self, rank: int) -> Slot:
        return self.group.slots[rank]

    def _step(self, timeout: float) -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=timeout)
        for ref in ready:
            rank = self.pending[ref]
            try:
                res = ray.get(ref, timeout=timing.CONTROL_CALL_S)  # ready: it only fetches the result
            except ray.exceptions.RayActorError as exc:
                cause = death_cause(exc)
                self.group.mark_dead(self._slot(rank).actor, cause)
                res = _died(rank, self._slot(rank), cause)
            del self.pending[ref]
            self.results[rank] = res
            self._emit(rank, res.outputs, res.metrics)
        self._drop_silent()
        if not self.pending:
            return
        failed = [r for r, res in self.results.items()
                  if res.failure is not None and not res.dead and r not in self.released]
        if failed:
            self._release(failed)
        if any(res.dead for res in self.results.values()):
            # Peers of a dead or stopped rank may wait for it in a collective: release them too.
            waiting = [r for r in self.pending.values() if r not in self.released]
            if waiting:
                self._release(waiting)
        self._poll()

    def _drop_silent(self) -> None:
        """End the cell for ranks the monitor found dead or unresponsive (their call may never return)."""
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        for ref, rank in list(self.pending.items()):
            slot = self._slot(rank)
            if slot.state == SlotState.UNRESPONSIVE:
                cause = slot.error
                try:
                    ray.kill(slot.actor, no_restart=True)  # a stopped process must not wake up mid-step
                except Exception:  # noqa: BLE001
                    pass
                del self.pending[ref]
                self.results[rank] = _died(rank, slot, cause, "WorkerUnresponsiveError")
                self.group.mark_dead(slot.actor, cause)
            elif slot.state == SlotState.DEAD:
                del self.pending[ref]
                self.results[rank] = _died(rank, slot, slot.error)

    def _emit(self, rank: int, outputs: List[Any], metrics: List[Dict[str, Any]]) -> None:
        route(self.sink, rank, outputs, self.shown, self.mode)
        if metrics:
            self.group.record_metrics(metrics)

    def _release(self, ranks: List[int]) -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        refs = [self._slot(r).actor.release.remote() for r in ranks]
        ray.wait(refs, num_returns=len(refs), timeout=timing.CONTROL_CALL_S)
        self.released.update(ranks)
        self._released_at = self._released_at or time.monotonic()

    def _stop_left_in_collective(self) -> None:
        """Framework backends (XGBoost, LightGBM): ranks still running ``stop_after_peer_failure_s`` after a peer
        failed are left in the library's collective, which nothing can release: stop them (named as died)."""
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        if self._stop_after_s is None or not self._released_at or not self.pending:
            return
        waited = time.monotonic() - self._released_at
        if waited >= timing.RELEASE_PEERS_S and not self._peers_released:  # first ask them to let go
            self._peers_released = True
            self._release([r for r in self.pending.values()])
        if waited < self._stop_after_s:
            return
        failed = sorted(r for r, res in self.results.items() if res.failure is not None)
        for ref, rank in list(self.pending.items()):
            slot = self._slot(rank)
            cause = (f"stopped by raytrain_nb: still running {self._stop_after_s:g} s after rank(s) "
                     f"{', '.join(map(str, failed))} failed, inside the {self.group.config.framework} collective "
                     "(its state is lost: %dist_restart replaces it)")
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
            del self.pending[ref]
            self.results[rank] = _died(rank, slot, cause)
            self.group.mark_dead(slot.actor, cause)

    def _poll(self) -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        running = list(self.pending.values())
        refs = {self._slot(r).actor.poll.remote(): r for r in running}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=timing.CONTROL_CALL_S)
        for ref in ready:
            try:
                polled = ray.get(ref, timeout=timing.CONTROL_CALL_S)
            except ray.exceptions.RayActorError:
                continue  # its run result reports the death
            self._emit(refs[ref], polled["outputs"], polled["metrics"])

    def _interrupt(self) -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        ranks = sorted(self.pending.values())
        refs = [self._slot(r).actor.interrupt.remote() for r in ranks]
        ray.wait(refs, num_returns=len(refs), timeout=timing.INTERRUPT_WAIT_S)
        self._stuck_deadline = time.monotonic() + timing.INTERRUPT_WAIT_S

    def _check_stuck(self) -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        if not self._stuck_deadline or time.monotonic() < self._stuck_deadline or not self.pending:
            return
        self._stuck_deadline = 0.0
        ranks = sorted(self.pending.values())
        refs = [self._slot(rank).actor.stack.remote() for rank in ranks]  # every rank at once, one deadline
        late = set(wait_within(refs, timing.CONTROL_CALL_S, "the stacks of the ranks that did not stop", logger)[1])
        lines = []
        for rank, ref in zip(ranks, refs):
            try:
                stack = f"(stack unavailable: no answer within {timing.CONTROL_CALL_S:g} s)" if ref in late \
                    else ray.get(ref, timeout=timing.CONTROL_CALL_S)  # ready: it only fetches the answer
            except Exception as exc:  # noqa: BLE001
                stack = f"(stack unavailable: {exc})"
            lines.append(f"rank {rank} did not stop after the interrupt; it is at:\n{stack.rstrip()}")
        lines.append("Interrupt again to replace the stuck rank(s) with fresh workers (their variables are lost).")
        self.sink.notice("\n".join(lines))

    def _replace_stuck(self) -> None:
        ranks = sorted(self.pending.values())
        self.sink.notice(f"replacing rank(s) {', '.join(map(str, ranks))} ...")
        for ref, rank in list(self.pending.items()):
            failure = RankFailure(rank, "KeyboardInterrupt",
                                  f"rank {rank} did not stop and was replaced by a fresh worker")
            self.results[rank] = CellOutcome.replaced_rank(rank, failure)
        self.pending.clear()
        self.group.replace(ranks)
