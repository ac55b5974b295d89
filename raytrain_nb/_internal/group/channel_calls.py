"""Calls other than cells over the ranks' channels (``channels.py``): a rollback or a load of a snapshot that needs
no collective costs each rank a Ray call's worth of CPU on both sides, as a no-op cell did before it went over the
channel; the same request over the rank's channel costs a frame.

:func:`collect_over` sends one request to every rank over its channel and returns the answers in rank order, with
the errors :meth:`GroupCore.collect` raises for the same calls through Ray; or None when not every rank has a free
channel (another machine, channels off, one in use by another thread), and the caller makes the Ray calls.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, List, Optional

from ..waits import wait_until
from . import timing
from .channels import ChannelCall, channels_for, claimed, close_channel, wait_calls
from .fanout import FANOUT, Replies, Reply, ReplyKind

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)

#: What to do when a call is given: the same hint as :meth:`GroupCore.collect`'s.
HINT = "raise start_timeout_s or check `ray status`"


def collect_over(core: "GroupCore", method: str, request: List[Any], timeout: float,
                 what: str) -> Optional[List[Any]]:
    """Every rank's answer to ``method(request)`` within ``timeout``, saying what it waits for after 5 s; None when
    the calls must go through Ray instead. ``method``: one the ranks' channels take (``worker/channel.py``), named
    as its Ray method ``Worker.<method>_packed`` is, without the suffix.

    Raises:
        WorkerDiedError: a rank died before it answered.
        GroupError: a rank did not answer in time, or raised; one line naming what.
    """
    ranks = list(range(len(core.slots)))
    with claimed(channels_for(core, ranks)) as lines:
        if lines is None:
            return None
        calls = [lines[r].send(request, method) for r in ranks]
        what = f"the workers to {what} the group"
        start = time.monotonic()
        wait_until(lambda slice_s: len(wait_calls(calls, slice_s)) == len(calls), timeout, what,
                   logger)  # a lost call ends its wait: asked after below
        left = max(0.0, timeout - (time.monotonic() - start))
        replies = [_reply(core, rank, call, left, method, request, what) for rank, call in zip(ranks, calls)]
    return Replies(replies, what, timeout).check(hint=HINT)


def _reply(core: "GroupCore", rank: int, call: ChannelCall, left_s: float, method: str, request: List[Any],
           what: str) -> Reply:
    """``call``'s answer as the fan-out types one: its value, what it raised, the rank's death, or late; a request
    that never reached its rank is made again as a Ray call."""
    if call.reply is not None:
        _, ok, value = call.reply
        return Reply(rank, ReplyKind.OK, value) if ok else Reply(rank, ReplyKind.RAISED, error=_error(value))
    if not call.lost:
        return Reply(rank, ReplyKind.LATE)
    # the connection ended first: the rank died, or it lives and kept its answer (asked through Ray)
    slot = core.slots[rank]
    close_channel(slot)  # the next call opens a new one
    asked = FANOUT.ask([slot], lambda s: s.actor.channel_result.remote(call.channel.token, call.seq, left_s),
                       timing.CONTROL_CALL_S + left_s, "what became of the call sent over the channel",
                       ranks=[rank]).replies[0]
    if asked.kind is ReplyKind.DIED:
        core.mark_dead(slot.actor, getattr(asked.error, "cause", str(asked.error)))
    if not asked.ok:
        return asked
    state = asked.value.get("state")
    if state == "done":
        _, ok, value = asked.value["reply"]
        return Reply(rank, ReplyKind.OK, value) if ok else Reply(rank, ReplyKind.RAISED, error=_error(value))
    if state == "running":
        return Reply(rank, ReplyKind.LATE)
    # it never arrived (the line closed first): the same request as a Ray call (a load twice loads the same state)
    return FANOUT.ask([slot], lambda s: getattr(s.actor, f"{method}_packed").remote(request),
                      max(left_s, timing.CONTROL_CALL_S), what, ranks=[rank]).replies[0]


def _error(value: Any) -> BaseException:
    """A failed reply's exception (the call's own, or the words of one that could not travel)."""
    return value if isinstance(value, BaseException) else RuntimeError(str(value))
