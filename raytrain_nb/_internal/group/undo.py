"""What a recovery plan that failed midway leaves: the group as it can go on, and nothing it cannot use.

``executor.py`` calls these when a step failed after a worker was touched: new workers that never joined go
(:func:`drop_unjoined`); fresh processes that did not come up all go, the handed-over state kept
(:func:`renewal_failed`); a resize whose new ranks could not join re-forms the kept workers as they were
(:func:`back_to`); a sharded group's resize re-forms its live kept workers and shards their models again from the
gathered mirrors, or fails with its cells refused in one line until a rescale or restart does
(:func:`settle_sharded`).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, List, Sequence

from ..errors import first_line
from .fanout import FANOUT, ReplyKind
from .rank_refresh import refresh_rank_values
from .retiring import kill_worker
from .slots import Slot
from .state import GroupState, SlotState
from .timing import PING_S

if TYPE_CHECKING:  # the core and formation are handed in; never imported here at run time
    from .core import GroupCore
    from .formation import Formation

logger = logging.getLogger(__name__)


def drop_unjoined(core: "GroupCore") -> None:
    """A formation that failed (a kept rank died while the new ones joined) leaves new workers that never joined:
    they hold none of the group's state, so they go and their ranks show dead. The group then shows what it has:
    a restart replaces them from a rank that holds the state, and with none left the restart says to start from
    a checkpoint; no cell or snapshot runs on a worker that holds nothing (it would write a snapshot without the
    group's state)."""
    for rank, slot in enumerate(core.slots):
        if not slot.joined and not slot.gone:
            kill_worker(slot)
            slot.mark(SlotState.DEAD, "started by a recovery that failed before it joined the group: it held none "
                                      "of the group's state")
            logger.warning("rank %d: its worker was started by a recovery that failed before it joined, and held "
                           "none of the group's state: it is stopped", rank)


def renewal_failed(core: "GroupCore") -> None:
    """Fresh processes for every rank did not come up: every one goes (none has the state), and the state
    handed over stays on the group for the next restart, which then needs no live rank."""
    for slot in core.slots:
        kill_worker(slot)
        slot.mark(SlotState.DEAD, "fresh processes for every rank failed to start")
    core.transition(GroupState.FAILED)
    if core.carried is not None:
        logger.warning("the state of rank %d is kept: %%dist_restart (group.restart()) again starts fresh processes "
                       "and loads it", core.carried[0])


def back_to(core: "GroupCore", formation: "Formation", keep: List[Slot], new: List[Slot],
            mirrors: Sequence[Any] = ()) -> None:
    """After a rescale the new ranks could not join: drop them and re-form the kept workers as they were.
    ``mirrors`` (refs to every old rank's mirror of its shards): the kept workers then shard their sharded models
    again from them, over the re-formed group (its size may differ, or a rank may have begun re-sharding)."""
    for slot in new:
        kill_worker(slot)
        core.slots.free.append(slot.place)
    core.slots.assign(keep)
    try:
        # the kept workers as they were: at the old size their sharded models keep their own shards
        formation.rendezvous("join", src=0, keep_shards=not mirrors and len(keep) == core.config.num_workers)
        if mirrors:
            core.collect([s.actor.reshard.remote(list(mirrors)) for s in core.slots], core.settings.start_timeout_s,
                         "shard their sharded models again from the mirrors in", collective=True)
            core.mirrors.refresh(core)
    except BaseException:
        core.transition(GroupState.FAILED)
        raise
    core.config = dataclasses.replace(core.config, num_workers=len(keep))
    refresh_rank_values(core)  # the kept workers' size may differ from before the rescale (dead ones dropped)
    core.transition(GroupState.IDLE)


def settle_sharded(core: "GroupCore", formation: "Formation", operation: str, kept: List[Slot], new: List[Slot],
                   mirrors: Sequence[Any], exc: BaseException) -> None:
    """A sharded group's resize failed after touching the workers, before every rank re-sharded: the kept
    workers that live re-form as the group and shard their models again from the gathered mirrors (the
    group goes on at that size, at the mirror point). Where that cannot be done the group fails, its cells
    refused in one line until a rescale or a restart shards the models again (the gathered mirrors stay
    held for it)."""
    for reply in FANOUT.ask(kept, lambda s: s.actor.ping.remote(), PING_S,
                            "the kept workers to answer a ping").of(ReplyKind.DIED):
        if not kept[reply.rank].gone:  # a kept worker that died in the failed step is left out
            kept[reply.rank].mark(SlotState.DEAD, reply.error.cause)
    keep = [slot for slot in kept if not slot.gone]
    cause = first_line(exc) or type(exc).__name__
    if keep and mirrors:
        try:
            back_to(core, formation, keep, new, mirrors=mirrors)
            logger.warning("the %s failed (%s): the group goes on with the %d kept worker(s), their sharded "
                           "models as at the last mirror point", operation, cause, len(keep))
            return
        except Exception as err:  # noqa: BLE001 - the first failure is the one raised; this one is logged
            logger.warning("the kept workers could not re-form and shard their models again: %s", first_line(err))
    else:
        drop_unjoined(core)
    core.mirrors.unsettled = (
        f"a {operation} failed after re-forming the process group ({cause}) and could not shard them "
        "again: %dist_rescale N (group.rescale(n)) shards them again from the mirrors; %dist_restart "
        "--from-checkpoint NAME loads a snapshot instead")
    if core.state is not GroupState.FAILED:
        core.transition(GroupState.FAILED)
