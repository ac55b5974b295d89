"""Which ranks are alive: marking dead or silent workers, the status table, interrupting every rank."""
from __future__ import annotations

import logging
from typing import Any, Dict, List

from ..errors import first_line
from .fanout import FANOUT, ReplyKind
from .state import GroupState, SlotState
from .timing import INTERRUPT_CALL_S, PING_S
from .types import WorkerStatus

logger = logging.getLogger(__name__)


class LivenessMixin:
    """Liveness of a :class:`~raytrain_nb.WorkerGroup`'s ranks, as the monitor, the dispatcher and users see it."""

    # -- failures noticed by the monitor and the dispatcher -----------------------------------

    def mark_dead(self, actor: Any, cause: str) -> None:
        """The worker process ``actor`` is gone: its rank turns dead and an idle group failed."""
        self._mark_gone(actor, SlotState.DEAD, cause)

    def mark_unresponsive(self, actor: Any, silent_s: float) -> None:
        """``actor`` has not answered a heartbeat for ``silent_s`` seconds."""
        self._mark_gone(actor, SlotState.UNRESPONSIVE, f"has not answered for {silent_s:.0f} s (stopped, e.g. "
                                                      "SIGSTOP, or blocked in C code holding the GIL)")

    def _mark_gone(self, actor: Any, state: SlotState, cause: str) -> None:
        with self._state_lock:
            rank = self.slots.rank_of(actor)
            if rank is None:
                return
            slot = self.slots[rank]
            if slot.state == SlotState.DEAD or (slot.gone and state == SlotState.UNRESPONSIVE):
                return
            slot.mark(state, cause)
            if state == SlotState.DEAD:
                logger.warning("rank %d (pid %s, node %s) died: %s", rank, slot.info.get("pid"),
                               slot.info.get("node_ip"), cause)
            else:
                logger.warning("rank %d (pid %s) %s", rank, slot.info.get("pid"), cause)
            if self.state is GroupState.IDLE:
                self.transition(GroupState.FAILED)
            else:
                self._notify()

    def status(self, ping: bool = True) -> List[WorkerStatus]:
        """One :class:`WorkerStatus` per rank; dead workers show as ``dead``.

        Args:
            ping: ask every live worker first, all at once (up to ``timing.PING_S``), so a death Ray
                knows of counts; ``False`` answers at once from what the group already knows (observers,
                the dashboard).
        """
        if ping:
            replies = FANOUT.ask(list(self.slots), lambda s: s.actor.ping.remote(), PING_S, "every rank to answer a ping")
            for reply in replies.of(ReplyKind.DIED):
                if not self.slots[reply.rank].gone:
                    self.slots[reply.rank].mark(SlotState.DEAD, reply.error.cause)
        if ping and any(s.state == SlotState.DEAD for s in self.slots) and self.state is GroupState.IDLE:
            self.transition(GroupState.FAILED)
        return [
            WorkerStatus(rank=i, node=s.info.get("node_ip", "?"), pid=s.info.get("pid", 0), device=s.device,
                         state=s.state, last_metrics=dict(self.latest_metrics.get(i, {})), error=s.error)
            for i, s in enumerate(self.slots)
        ]

    def interrupt(self) -> List[Dict[str, Any]]:
        """Interrupt the running code on every rank (KeyboardInterrupt in user code).

        Every live rank is asked at once, with one deadline (``timing.INTERRUPT_CALL_S``) for all: a rank
        that did not answer by then is ``unreachable``.
        """
        live = [s for s in self.slots if s.state != SlotState.DEAD]
        replies = FANOUT.ask(live, lambda s: s.actor.interrupt.remote(), INTERRUPT_CALL_S,
                             "every rank to take the interrupt")
        out = []
        for reply in replies:
            if reply.ok:
                out.append(reply.value)
            elif reply.kind is ReplyKind.LATE:
                out.append({"state": "unreachable", "error": f"no answer within {INTERRUPT_CALL_S:g} s"})
            else:
                out.append({"state": "unreachable", "error": first_line(reply.error)})
        return out
