"""Ending workers: those whose places are to take new ones (Ray records the dead first, then every one is
killed), and every worker of a group that shuts down."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

from .channels import close_channel
from .placement import await_recorded_deaths
from .state import SlotState

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)


def kill_worker(slot: Any) -> None:
    """End ``slot``'s worker process (already gone is fine)."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    close_channel(slot)

    try:
        ray.kill(slot.actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


def retire(slots: Sequence[Any]) -> None:
    """Kill the workers of ``slots`` so their places can take new ones.

    The dead ones are first left to Ray to record as dead: a process that died on a live node is
    recorded at once, one on a lost node only when Ray declares the node dead, and until then the
    node's placement-group bundles still look usable (a worker started there dies at once). Killing
    them ourselves would have Ray record them dead at once and hide that.
    """
    await_recorded_deaths([s.actor for s in slots if s.state == SlotState.DEAD])
    for slot in slots:
        kill_worker(slot)


def teardown(core: "GroupCore") -> None:
    """Stop every worker of the group (ranks and spares), release its places and close its run storage."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb
    # ray: loaded when a group or trainer runs, not on import raytrain_nb
    from ray.util.placement_group import remove_placement_group

    # The places go first: removing a placement group has Ray end the actors in it, and its answer does not wait
    # for them to exit (after the kills it did: 16 torch processes exiting on 2 cores, 50-150 ms). Each worker is
    # then killed all the same (one outside the group's places, or a removal that failed). Killing a process ends
    # its process group with it: nothing is asked of the ranks first (closing each one's process group cost a gloo
    # teardown a rank, ~4 ms at 8 ranks). The group's health monitor is stopped before this, so no death here is
    # taken for a failure.
    for pg in core.slots.pgs:
        try:
            remove_placement_group(pg)
        except Exception as exc:  # noqa: BLE001 - teardown goes on, and says what it left
            logger.warning("could not release placement group %s: %s", pg.id.hex(), exc)
    for s in core.slots.everyone():
        try:
            ray.kill(s.actor, no_restart=True)
        except Exception as exc:  # noqa: BLE001 - already gone is fine; anything else is said
            if not isinstance(exc, ray.exceptions.RayActorError):
                logger.warning("could not stop the worker of pid %s: %s", s.info.get("pid"), exc)
    core.run_storage.close()
