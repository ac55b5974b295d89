"""Which ranks are alive, as users see it: the status table, and interrupting every rank.

The marks themselves (a rank dead or silent) are the core's (``GroupCore.mark_dead`` /
``mark_unresponsive``), made by the monitor, the dispatcher and the pings here.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, List

from ..errors import first_line
from .fanout import FANOUT, ReplyKind
from .state import GroupState, SlotState
from .timing import INTERRUPT_CALL_S, PING_S
from .types import WorkerStatus

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)


def ping(core: "GroupCore") -> None:
    """Ask every worker at once (up to ``timing.PING_S``): a death Ray knows of but the monitor has not seen
    yet marks its rank dead, and an idle group with a dead rank failed. The answer is the rank's resources
    (``vitals.py``)."""
    replies = FANOUT.ask(list(core.slots), lambda s: s.actor.resources.remote(), PING_S, "every rank to answer a ping")
    for rank, sample in replies.values().items():
        core.vitals.take(rank, sample)
    for reply in replies.of(ReplyKind.DIED):
        if not core.slots[reply.rank].gone:
            core.slots[reply.rank].mark(SlotState.DEAD, reply.error.cause)
    if any(s.state == SlotState.DEAD for s in core.slots) and core.state is GroupState.IDLE:
        core.transition(GroupState.FAILED)


def status(core: "GroupCore", ping_first: bool = True) -> List[WorkerStatus]:
    """One :class:`WorkerStatus` per rank (see ``WorkerGroup.status``)."""
    if ping_first:
        ping(core)
    return [
        WorkerStatus(rank=i, node=s.info.get("node_ip", "?"), pid=s.info.get("pid", 0), device=s.device,
                     state=s.state, last_metrics=dict(core.latest_metrics.get(i, {})), error=s.error,
                     shard=core.mirrors.share_text(i), **core.vitals.of(i))
        for i, s in enumerate(core.slots)
    ]


def interrupt(core: "GroupCore") -> List[Dict[str, Any]]:
    """Interrupt the running code on every live rank, all asked at once under one deadline
    (``timing.INTERRUPT_CALL_S``): a rank that did not answer by then is ``unreachable``."""
    live = [s for s in core.slots if s.state != SlotState.DEAD]
    cell = core.running_cell  # on a rank where it has not begun (it waits behind another call), it is cancelled
    replies = FANOUT.ask(live, lambda s: s.actor.interrupt.remote(
        cell_id=cell if s.state == SlotState.RUNNING else None), INTERRUPT_CALL_S, "every rank to take the interrupt")
    out = []
    for reply in replies:
        if reply.ok:
            out.append(reply.value)
        elif reply.kind is ReplyKind.LATE:
            out.append({"state": "unreachable", "error": f"no answer within {INTERRUPT_CALL_S:g} s"})
        else:
            out.append({"state": "unreachable", "error": first_line(reply.error)})
    return out
