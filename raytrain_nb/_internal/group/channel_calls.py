"""Calls other than cells over the ranks' channels (``channels.py``): a rollback, a load of state with no sharded
part, or a pull costs each rank a Ray call's worth of CPU on both sides (about half a millisecond each), as a no-op
cell did before it went over the channel; the same request over the rank's channel costs a frame.

:func:`ask_over` sends one request to each of some ranks over its channel and types the answers as
:meth:`Fanout.ask` types a Ray call's (value, raised, died, late), so the caller reads them as it read those; or
gives None when not every rank has a free channel (another machine, channels off, one in use by another thread),
and the caller makes the Ray calls. :func:`collect_over` is it for every rank, checked as
:meth:`GroupCore.collect` checks the same calls through Ray.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Sequence

from ..waits import wait_until
from . import timing
from .channels import ChannelCall, channels_for, claimed, close_channel, wait_calls
from .fanout import FANOUT, Replies, Reply, ReplyKind
from .slots import Slot

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)

#: What to do when a call is given up on: the same hint as :meth:`GroupCore.collect`'s.
HINT = "raise start_timeout_s or check `ray status`"


def ask_over(core: "GroupCore", ranks: Sequence[int], method: str, request: Any, timeout: float, what: str,
             ray_call: Callable[[Slot], Any]) -> Optional[Replies]:
    """Each rank of ``ranks``' answer to ``method(request)`` (a method the ranks' channels take:
    ``worker/channel.py``) within ``timeout``, saying what it waits for after 5 s (``what``, a noun phrase after
    "waiting for"); None when the calls must go through Ray instead. ``ray_call(slot)``: the same call as a Ray
    call, made for a rank the request never reached (its line closed first; the rank lives)."""
    ranks = list(ranks)
    if any(core.slots[r].gone for r in ranks):  # the fan-out names a dead rank at once, without asking it
        return None
    with claimed(channels_for(core, ranks)) as lines:
        if lines is None:
            return None
        calls = [lines[r].send(request, method) for r in ranks]
        start = time.monotonic()
        wait_until(lambda slice_s: len(wait_calls(calls, slice_s)) == len(calls), timeout, what,
                   logger)  # a lost call ends its wait: asked after below
        left = max(0.0, timeout - (time.monotonic() - start))
        replies = [_reply(core, rank, call, left, what, ray_call) for rank, call in zip(ranks, calls)]
    return Replies(replies, what, timeout)


def collect_over(core: "GroupCore", method: str, request: Any, timeout: float, what: str,
                 ray_call: Callable[[Slot], Any]) -> Optional[List[Any]]:
    """Every rank's answer to ``method(request)``, as :func:`ask_over`; None: make the Ray calls.

    Raises:
        WorkerDiedError: a rank died before it answered.
        GroupError: a rank did not answer in time, or raised; one line naming what.
    """
    replies = ask_over(core, range(len(core.slots)), method, request, timeout, f"the workers to {what} the group",
                       ray_call)
    return None if replies is None else replies.check(hint=HINT)


def _reply(core: "GroupCore", rank: int, call: ChannelCall, left_s: float, what: str,
           ray_call: Callable[[Slot], Any]) -> Reply:
    """``call``'s answer as the fan-out types one: its value, what it raised, the rank's death, or late; a request
    that never reached its rank is made again as a Ray call."""
    if call.reply is not None:
        return _answer(rank, call.reply)
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
        return _answer(rank, asked.value["reply"])
    if state == "running":
        return Reply(rank, ReplyKind.LATE)
    # it never arrived (the line closed first): the same request as a Ray call (each of these may run twice)
    return FANOUT.ask([slot], ray_call, max(left_s, timing.CONTROL_CALL_S), what, ranks=[rank]).replies[0]


def _answer(rank: int, reply: List[Any]) -> Reply:
    """A channel's reply ``[seq, ok, value]`` as a fan-out reply: the value, or the exception the call raised."""
    _, ok, value = reply
    if ok:
        return Reply(rank, ReplyKind.OK, value)
    return Reply(rank, ReplyKind.RAISED, error=value if isinstance(value, BaseException) else RuntimeError(str(value)))
