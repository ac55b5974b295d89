"""Ending workers: those whose places are to take new ones (Ray records the dead first, then every one is
killed), and every worker of a group that shuts down."""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Sequence

from .fanout import FANOUT
from .placement import await_recorded_deaths
from .state import SlotState
from .timing import CONTROL_CALL_S

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)


def kill_worker(slot: Any) -> None:
    """End ``slot``'s worker process (already gone is fine)."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

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

    live = [s for s in core.slots if s.state != SlotState.DEAD]
    FANOUT.ask(live, lambda s: s.actor.shutdown_backend.remote(), CONTROL_CALL_S,
               "every rank to close its process group")  # one that does not answer is killed all the same
    for s in core.slots.everyone():
        try:
            ray.kill(s.actor, no_restart=True)
        except Exception as exc:  # noqa: BLE001 - already gone is fine; anything else is said
            if not isinstance(exc, ray.exceptions.RayActorError):
                logger.warning("could not stop the worker of pid %s: %s", s.info.get("pid"), exc)
    for pg in core.slots.pgs:
        try:
            remove_placement_group(pg)
        except Exception as exc:  # noqa: BLE001 - teardown goes on, and says what it left
            logger.warning("could not release placement group %s: %s", pg.id.hex(), exc)
    core.run_storage.close()
