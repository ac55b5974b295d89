"""Ending workers whose places are to take new ones: Ray records the dead first, then every one is killed."""
from __future__ import annotations

from typing import Any, Sequence

from .placement import await_recorded_deaths
from .state import SlotState


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
