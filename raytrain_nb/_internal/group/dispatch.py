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
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple

from ..errors import GroupError, RankFailure
from ..output import OutputSink, route
from ..worker.outcome import CellOutcome
from . import timing
from .cellwatch import CellWatch
from .channels import ChannelCall, close_channel, wait_calls
from .debug import Prompt
from .collectives import tell_finished
from .fanout import FANOUT, Replies, ReplyKind, classify, death_of
from .nodepoll import poll_ranks
from .slots import Slot
from .state import SlotState

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)


def _died(rank: int, slot: Slot, cause: str, unresponsive: bool = False) -> CellOutcome:
    return CellOutcome.died(rank, RankFailure.of_lost(death_of(rank, slot, cause, unresponsive)))


def _from_reply(rank: int, reply: List[Any]) -> CellOutcome:
    """The outcome in a channel's reply ``[seq, ok, value]``; ``run_cell`` failing outside the user's code is ours,
    raised as a Ray call's error would be."""
    _, ok, value = reply
    if not ok:
        raise GroupError(f"rank {rank}: the cell failed outside your code: {value}")
    return CellOutcome.from_wire(value)


class Dispatch:
    """One cell (or function call) in flight on some ranks of the group of ``core``; ``replace(ranks)`` gives
    ranks stuck after a second interrupt fresh workers."""

    def __init__(self, core: "GroupCore", replace: Callable[[List[int]], None], refs: Dict[Any, int],
                 sink: OutputSink, mode: str, shown: Sequence[int], prompt: Optional[Prompt] = None,
                 quiet_after_s: float = 0.0) -> None:
        self.core = core
        self._replace = replace
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
        self._first = True  # the first wait of the call (see _step)
        # cells sent over the ranks' channels (channels.py): every call is one, or none is
        self._over_channels = any(isinstance(ref, ChannelCall) for ref in refs)
        self._told: Set[int] = set()  # ranks rank 0's worker was told ended the call (raytrain_nb.collective)
        # a framework backend's collective (C++) cannot be released: ranks left in it are stopped after this long
        self._stop_after_s = core.kind.stop_after_peer_failure_s
        self.watch = CellWatch(core, sink, prompt, quiet_after_s)  # resources, debugger prompts, a quiet cell

    def collect(self) -> Dict[int, CellOutcome]:
        while True:
            try:  # the loop's own check inside the try too: a Ctrl-C landing there is no less an interrupt
                while self.pending:
                    self._step(timing.POLL_INTERVAL_S)
                    self._check_stuck()
                    self._stop_left_in_collective()
                    self.watch.check()
                self.watch.finish(any(res.failure is not None for res in self.results.values()))
                return self.results
            except KeyboardInterrupt:
                self.interrupts += 1
                if self.interrupts == 1:
                    self._interrupt()
                else:
                    self._replace_stuck()

    def _slot(self, rank: int) -> Slot:
        return self.core.slots[rank]

    def _step(self, timeout: float) -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        outcomes = None
        if self._over_channels:
            ready, outcomes = self._channel_step(timeout)
        elif self._first:  # most cells end within the first interval: their answers in one call, not a wait and a get
            self._first = False
            try:
                outcomes = [CellOutcome.from_wire(x) for x in ray.get(list(self.pending), timeout=timeout)]
                ready = list(self.pending)
            except Exception:  # noqa: BLE001 - still running (GetTimeoutError) or a death: the general path sorts it
                timeout = 0.0
        if outcomes is None:
            ready, _ = ray.wait(list(self.pending), num_returns=len(self.pending), timeout=timeout)
            outcomes = self._fetch(ready)
        metrics: List[Dict[str, Any]] = []
        for ref, res in zip(ready, outcomes):
            rank = self.pending.pop(ref)
            self.results[rank] = res
            self._emit(rank, res.outputs, [])
            metrics.extend(res.metrics)
        self._emit_metrics(metrics)  # every rank that ended this round: one call to the core, not one per rank
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

    def _channel_step(self, timeout: float) -> Tuple[List[Any], List[CellOutcome]]:
        """Wait up to ``timeout`` for replies on the ranks' channels; the calls that ended and their outcomes (a call
        whose connection ended first is asked after through Ray: ``_lost``)."""
        calls = list(self.pending)
        orphans = [c for c in calls if c.orphan]
        live = [c for c in calls if not c.orphan]
        ended = wait_calls(live, timeout if not orphans else 0.0)
        ready: List[Any] = []
        outcomes: List[CellOutcome] = []
        for call in ended + orphans:
            rank = self.pending[call]
            if call.reply is not None:
                outcome: Optional[CellOutcome] = _from_reply(rank, call.reply)
            else:
                outcome = self._lost(rank, call, timeout if orphans and not live else 0.0)
            if outcome is not None:
                ready.append(call)
                outcomes.append(outcome)
        return ready, outcomes

    def _lost(self, rank: int, call: ChannelCall, wait_s: float) -> Optional[CellOutcome]:
        """The outcome of a call whose channel ended before its reply: the rank's death, its reply kept by the
        worker, or a failure when the request never reached it; None while the rank still runs it."""
        slot = self._slot(rank)
        close_channel(slot)  # the next cell opens a new one
        reply = self._ask([rank], lambda s: s.actor.channel_result.remote(call.channel.token, call.seq, wait_s),
                          timing.CONTROL_CALL_S + wait_s, "what became of the cell sent over the channel")[0]
        if reply.kind is ReplyKind.DIED:
            self.core.mark_dead(slot.actor, reply.error.cause)
            return CellOutcome.died(rank, RankFailure.of_lost(reply.error))
        if reply.kind is ReplyKind.UNRESPONSIVE:
            return _died(rank, slot, slot.error, unresponsive=True)
        if reply.kind is ReplyKind.RAISED:
            raise reply.error
        state = reply.value.get("state") if reply.ok else "running"  # late: asked again next round
        if state == "done":
            return _from_reply(rank, reply.value["reply"])
        if state == "running":
            call.orphan = True
            return None
        return CellOutcome(rank=rank, failure=RankFailure(
            rank, "ConnectionError", f"the cell did not reach rank {rank}: its connection to the driver closed "
            "before it arrived; run the cell again"))

    def _fetch(self, ready: List[Any]) -> List[CellOutcome]:
        """The outcomes of ready calls: in one fetch while every rank answered, else rank by rank, a rank whose
        process died coming back as its death (``run_cell`` catches the user's errors: any other error is ours)."""
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        try:
            return [CellOutcome.from_wire(x) for x in ray.get(ready, timeout=timing.CONTROL_CALL_S)]  # ready: a fetch
        except Exception:  # noqa: BLE001 - which one failed, and how, is sorted out rank by rank
            pass
        out = []
        for ref in ready:
            rank = self.pending[ref]
            try:
                out.append(CellOutcome.from_wire(ray.get(ref, timeout=timing.CONTROL_CALL_S)))
            except Exception as exc:  # noqa: BLE001 - run_cell catches the user's errors: this is a death
                kind, error = classify(exc, rank, self._slot(rank))
                if kind is not ReplyKind.DIED:
                    raise
                self.core.mark_dead(self._slot(rank).actor, error.cause)
                out.append(CellOutcome.died(rank, RankFailure.of_lost(error)))
        return out

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
                self.results[rank] = _died(rank, slot, cause, unresponsive=True)
                self.core.mark_dead(slot.actor, cause)
            elif slot.state == SlotState.DEAD:
                del self.pending[ref]
                self.results[rank] = _died(rank, slot, slot.error)

    def _emit(self, rank: int, outputs: List[Any], metrics: List[Dict[str, Any]]) -> None:
        route(self.sink, rank, outputs, self.shown, self.mode)
        if outputs or metrics:
            self.watch.heard()
        if metrics:
            self.core.record_metrics(metrics)

    def _emit_metrics(self, metrics: List[Dict[str, Any]]) -> None:
        """A round's reports in one call: the core, the slow-rank check and each observer once."""
        if metrics:
            self.watch.heard()
            self.core.record_metrics(metrics)

    def _ask(self, ranks: Sequence[int], call: Any, deadline_s: float, what: str) -> Replies:
        return FANOUT.ask([self._slot(r) for r in ranks], call, deadline_s, what, ranks=ranks)

    def _release(self, ranks: List[int]) -> None:
        self._ask(ranks, lambda s: s.actor.release.remote(), timing.CONTROL_CALL_S,
                  "the ranks left in a collective to be released")
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
                     f"{', '.join(map(str, failed))} failed, inside the {self.core.kind.name} collective "
                     "(its state is lost: %dist_restart replaces it)")
            try:
                ray.kill(slot.actor, no_restart=True)
            except Exception:  # noqa: BLE001 - already gone
                pass
            del self.pending[ref]
            self.results[rank] = _died(rank, slot, cause)
            self.core.mark_dead(slot.actor, cause)

    def _poll(self) -> None:
        polls = poll_ranks(self.core, list(self.pending.values()),  # a node's ranks through one of them
                           lambda ranks: self._ask(ranks, lambda s: s.actor.poll.remote(), timing.CONTROL_CALL_S,
                                                   "the running ranks' output"))
        self.take_polls(polls)

    def take_polls(self, polls: Dict[int, Dict[str, Any]]) -> None:
        """One round of the running ranks' polls (``{rank: Worker.poll()}``): output to the sink, metrics to the
        core, resources and debugger prompts to the watch (the driver's whole path, which a load test feeds)."""
        waiting = {}
        metrics: List[Dict[str, Any]] = []
        for rank, polled in polls.items():  # a dead rank's run result reports its death
            self._emit(rank, polled["outputs"], [])
            metrics.extend(polled["metrics"])
            self.watch.polled(rank, polled)
            if polled.get("collective"):
                waiting[rank] = polled["collective"]
        self._emit_metrics(metrics)
        self.core.mirrors.staged(self.core, polls)  # mirrors taken every K reports: to the buddies
        if waiting and self.results:  # ranks wait in a collective for peers whose call already ended
            tell_finished(self._slot(0).actor, self.results, waiting, self._told)
        self.watch.round_done()

    def _interrupt(self) -> None:
        cell = self.core.running_cell  # cancelled on a rank where it has not begun (it waits behind another call)
        self._ask(sorted(self.pending.values()), lambda s: s.actor.interrupt.remote(cell_id=cell),
                  timing.INTERRUPT_WAIT_S, "the running ranks to take the interrupt")
        self._stuck_deadline = time.monotonic() + timing.INTERRUPT_WAIT_S

    def _check_stuck(self) -> None:
        if not self._stuck_deadline or time.monotonic() < self._stuck_deadline or not self.pending:
            return
        self._stuck_deadline = 0.0
        replies = self._ask(sorted(self.pending.values()), lambda s: s.actor.stack.remote(), timing.CONTROL_CALL_S,
                            "the stacks of the ranks that did not stop")
        lines = []
        for reply in replies:
            if reply.ok:
                stack = reply.value
            elif reply.kind is ReplyKind.LATE:
                stack = f"(stack unavailable: no answer within {timing.CONTROL_CALL_S:g} s)"
            else:
                stack = f"(stack unavailable: {reply.error})"
            lines.append(f"rank {reply.rank} did not stop after the interrupt; it is at:\n{stack.rstrip()}")
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
        self._replace(ranks)
