"""Reserve resources for a group (feasibility check at once, then a placement group with a timeout, or
none for a caller that waits as long as it lives), and tell when the places of dead workers can take new ones."""
from __future__ import annotations

import dataclasses
import logging
import time
from typing import Any, Dict, List, Optional

from .. import cluster
from ..errors import ResourceError
from ..waits import wait_until, wait_within
from .config import GroupConfig
from .keeper import remove_with_caller

logger = logging.getLogger(__name__)


def _fmt(res: Dict[str, float]) -> str:
    """Resources as text, without the per-placement-group bookkeeping entries Ray adds."""
    shown = {k: v for k, v in res.items() if "_group_" not in k and not k.startswith(("node:", "bundle_group"))}
    return ", ".join(f"{v:g} {k}" for k, v in sorted(shown.items())) or "nothing"


def check_feasible(config: GroupConfig, count: int, total: Dict[str, float],
                   node_totals: List[Dict[str, float]]) -> None:
    """Fail at once when the cluster could never place ``count`` workers.

    Raises:
        ResourceError: naming what was asked and what the cluster has.
    """
    bundle = config.bundle()
    for key, per in bundle.items():
        need = per * count
        have = total.get(key, 0.0)
        if need > have + 1e-9:
            flag = {"CPU": "--cpus", "GPU": "--gpus"}.get(key, "resources_per_worker")
            raise ResourceError(
                f"{count} workers x {per:g} {key} = {need:g} {key} asked, but the cluster has {have:g} {key}: "
                f"use fewer workers or a smaller {flag}"
            )
    if node_totals and not any(all(n.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()) for n in node_totals):
        raise ResourceError(f"one worker asks for {_fmt(bundle)}, more than any single node has")


#: On the embedded instance a group may ask up to this many times the CPUs the machine (or container) has.
SHARE_LIMIT = 4


def share_cpus(config: GroupConfig, count: int) -> GroupConfig:
    """On the embedded instance, a group of ``count`` asking more CPUs than there are (up to
    :data:`SHARE_LIMIT` times) shares them: each worker reserves an equal part of all but one CPU (none on
    one CPU), so one is left for Ray Data's tasks, and a one-line note says so. Otherwise ``config``.

    Beyond the limit, and on a cluster this process did not start, the request is left to
    :func:`check_feasible`'s error.
    """
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    per = float(config.cpus_per_worker)
    if not (cluster.started_by_us() or cluster.on_shared_instance()) or per == 0:
        return config
    have = float(ray.cluster_resources().get("CPU", 0.0))
    asked = per * count
    if asked <= have + 1e-9 or asked > SHARE_LIMIT * have + 1e-9 or have <= 0:
        return config
    shared = int(max(0.0, have - 1.0) / count * 1000) / 1000  # Ray keeps 4 decimals; round down
    logger.warning("%d workers x %g CPU = %g CPU asked on a machine with %g: the workers share its CPUs "
                   "(each runs slower; up to %dx the CPUs can be shared)", count, per, asked, have, SHARE_LIMIT)
    return dataclasses.replace(config, cpus_per_worker=shared)


def check_cluster(config: GroupConfig, count: int) -> None:
    """:func:`check_feasible` against the connected Ray cluster."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    check_feasible(config, count, ray.cluster_resources(), nodes)


#: A wait without a deadline says what it waits for after this long, then every ``UNBOUNDED_SAY_EVERY_S``.
UNBOUNDED_FIRST_SAY_S = 5.0
UNBOUNDED_SAY_EVERY_S = 30.0


def _await_unbounded(ready_ref: Any, what: str) -> bool:
    """Wait for ``ready_ref`` as long as the caller lives, saying at WARNING what it waits for, how long so far
    and what is free, after 5 s and then every 30 s."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    start = time.monotonic()
    slice_s = UNBOUNDED_FIRST_SAY_S
    while True:
        ready, _ = ray.wait([ready_ref], timeout=slice_s)
        if ready:
            return True
        logger.warning("waiting for %s, with no deadline: as long as the caller lives (%.0f s so far); free now: %s",
                       what, time.monotonic() - start, _fmt(ray.available_resources()))
        slice_s = UNBOUNDED_SAY_EVERY_S


def reserve(config: GroupConfig, count: int, timeout_s: Optional[float], detached: bool = False) -> Any:
    """Create a ready placement group of ``count`` bundles, or raise within ``timeout_s``.

    ``timeout_s=None`` waits as long as the caller lives (a group inside a Ray Tune trial, where Tune
    decides how many trials run at once), saying every 30 s what it waits for.

    Raises:
        ResourceError: the resources did not become free in time (names what is free).
    """
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb
    from ray.util.placement_group import (  # ray: loaded when a group or trainer runs, not on import raytrain_nb
        placement_group, remove_placement_group)

    check_cluster(config, count)
    bundle = config.placement_bundle()
    pg = placement_group([dict(bundle) for _ in range(count)], strategy=config.placement_strategy,
                         lifetime="detached" if detached else None)  # a keep-alive group's outlives its driver
    remove_with_caller(pg)  # made inside an actor (a Tune trial): removed when that actor dies, whatever stops it
    what = f"resources for {count} workers x ({_fmt(bundle)}), strategy {config.placement_strategy}"
    try:
        if timeout_s is None:
            ready = _await_unbounded(pg.ready(), what)
        else:
            ready = bool(wait_within([pg.ready()], timeout_s, what, logger)[0])
    except BaseException:  # Ctrl-C (or anything else) while waiting: never leave the reservation behind
        remove_placement_group(pg)
        raise
    if not ready:
        free = ray.available_resources()
        remove_placement_group(pg)
        raise ResourceError(
            f"{count} workers x ({_fmt(bundle)}) could not be placed within {timeout_s:g} s "
            f"(strategy {config.placement_strategy}); free now: {_fmt(free)}. Other groups or tasks "
            "hold the rest: shut them down, or ask for fewer workers/resources"
        )
    return pg


#: At most this long for Ray's control store to record a killed worker as dead. A worker whose
#: node was lost is recorded only once Ray declares the node dead (health checks: 15-30 s with
#: Ray's defaults); a process that died on a live node is recorded at once.
DEATH_RECORD_WAIT_S = 60.0


def _actor_state(actor: Any) -> str:
    """Ray's control-store state of ``actor`` (ALIVE, DEAD, ...); "" when it cannot be read."""
    from ray._private.state import state  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    try:
        return state.actor_table(actor._actor_id.hex()).get("State", "")
    except Exception:  # noqa: BLE001 - an unreadable table counts as unknown
        logger.debug("cannot read the actor table", exc_info=True)
        return ""


def await_recorded_deaths(actors: List[Any], timeout_s: float = DEATH_RECORD_WAIT_S) -> bool:
    """Wait until Ray records each of ``actors`` (already killed or dead) as DEAD.

    Until then Ray may still count a lost node, and the placement-group bundles on it, as
    alive: a worker started in such a bundle dies at once. True when every death is recorded.
    """
    start = time.monotonic()
    deadline, said = start + timeout_s, False
    waiting = list(actors)
    while waiting:
        waiting = [a for a in waiting if _actor_state(a) not in ("DEAD", "")]
        if not waiting:
            return True
        if not said and time.monotonic() - start > 1.0:  # say why nothing seems to happen
            said = True
            logger.warning("waiting for Ray to declare %d lost worker(s) dead before reusing their places: their "
                           "node is probably gone (Ray's health checks take 15-30 s by default; at most %g s)",
                           len(waiting), timeout_s)
        if time.monotonic() >= deadline:
            logger.warning("Ray has not recorded %d dead worker(s) as dead after %g s", len(waiting), timeout_s)
            return False
        time.sleep(0.1)
    return True


def bundles_placed(places: List[Any]) -> List[bool]:
    """For each ``(pg, bundle)`` of ``places``: is it on a node Ray counts as alive now?

    One read of the node table, and one of each placement group's table, for all of them.
    """
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb
    from ray.util.placement_group import placement_group_table  # ray: as above

    if not places:
        return []
    alive = {n.get("NodeID") for n in ray.nodes() if n.get("Alive")}
    tables: Dict[Any, Dict[Any, Any]] = {}
    out = []
    for pg, index in places:
        if pg.id not in tables:
            tables[pg.id] = placement_group_table(pg).get("bundles_to_node_id", {})
        out.append(tables[pg.id].get(index) in alive)
    return out


def await_bundles(places: List[Any], timeout_s: float) -> bool:
    """Wait up to ``timeout_s`` for every ``(pg, bundle)`` in ``places`` to be placed on a live node."""
    def placed(slice_s: float) -> bool:
        if all(bundles_placed(places)):
            return True
        time.sleep(min(slice_s, 0.2))
        return False

    return wait_until(placed, timeout_s, f"{len(places)} place(s) of dead workers to be on a live node again",
                      logger)
