"""Placement groups made inside a Ray actor are removed when that actor dies (a keeper actor does it).

Ray kills the actors a dead actor owned at once, but keeps the placement groups it created until
its whole job ends. A group started inside an actor (a Ray Tune trial: Tune kills the trial's
actor right after asking it to stop, maybe before ``shutdown`` ran) would hold its resources,
reserved and empty, for the rest of the sweep. So a group made inside an actor hands each of its
placement groups to one keeper per cluster (a detached actor of no resources), which removes them
once their maker is dead, within ``timing.KEEPER_POLL_S``, and ends itself when it has watched nothing
for ``timing.KEEPER_IDLE_S``.
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Dict, Set

from .timing import KEEPER_IDLE_S, KEEPER_POLL_S

logger = logging.getLogger(__name__)

KEEPER_NAME = "raytrain_nb_placement_keeper"
KEEPER_NAMESPACE = "raytrain_nb"


class PlacementKeeper:
    """The keeper actor: ``keep(owner, pg)``; removes ``pg`` once the actor ``owner`` is dead."""

    def __init__(self) -> None:
        self._kept: Dict[str, Set[str]] = {}
        self._lock = threading.Lock()
        self._idle_since = time.monotonic()
        threading.Thread(target=self._loop, name="placement keeper", daemon=True).start()

    def keep(self, owner: str, pg: str) -> None:
        """Remove placement group ``pg`` (hex id) when actor ``owner`` (hex id) is dead."""
        with self._lock:
            self._kept.setdefault(owner, set()).add(pg)

    def _loop(self) -> None:
        from ray._private.state import state  # ray: runs inside the keeper actor only

        while True:
            time.sleep(KEEPER_POLL_S)
            with self._lock:
                owners = list(self._kept)
                if owners:
                    self._idle_since = time.monotonic()
                elif time.monotonic() - self._idle_since > KEEPER_IDLE_S:
                    os._exit(0)  # nothing to keep: the keeper goes (a new one starts on the next use)
            for owner in owners:
                try:
                    dead = state.actor_table(owner).get("State") == "DEAD"
                except Exception:  # noqa: BLE001 - an unreadable table: try again next round
                    logger.debug("cannot read the actor table", exc_info=True)
                    continue
                if dead:
                    with self._lock:
                        pgs = self._kept.pop(owner, set())
                    for pg in pgs:
                        _remove(pg)


def _remove(pg_hex: str) -> None:
    import ray  # ray: runs inside the keeper actor only
    from ray.util.placement_group import PlacementGroup, remove_placement_group  # ray: as above

    try:
        remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(pg_hex))))
    except Exception:  # noqa: BLE001 - already removed (the group's own shutdown came first)
        logger.debug("placement group %s: already removed", pg_hex, exc_info=True)


_KEEPER_CLASS: Any = None


def remove_with_caller(pg: Any) -> None:
    """When called inside a Ray actor: have ``pg`` removed once that actor is dead. No-op on a driver.

    Never waits: the request is queued to the keeper (started here on first use).
    """
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb
    # ray: as above
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    global _KEEPER_CLASS
    owner = ray.get_runtime_context().get_actor_id()
    if owner is None:
        return  # a driver: Ray removes its placement groups when its job ends
    try:
        if _KEEPER_CLASS is None:
            _KEEPER_CLASS = ray.remote(num_cpus=0, max_restarts=0)(PlacementKeeper)
        keeper = _KEEPER_CLASS.options(
            name=KEEPER_NAME, namespace=KEEPER_NAMESPACE, lifetime="detached", get_if_exists=True,
            # outside the caller's placement group (Tune captures a trial's children in its own): it must outlive it
            scheduling_strategy=PlacementGroupSchedulingStrategy(placement_group=None)).remote()
        keeper.keep.remote(owner, pg.id.hex())
    except Exception as exc:  # noqa: BLE001 - without a keeper, the group's own shutdown still removes it
        logger.warning("could not hand placement group %s to the keeper: %s", pg.id.hex(), exc)
