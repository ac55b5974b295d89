"""What a trainer does after a failed attempt, and when an elastic run grows: decisions as data.

:func:`decide` looks at the failure and the cluster and returns one small decision;
:func:`carry_out` is the one place that acts on it, through the group's public methods:

- :class:`Retry`: every worker is alive (the loop raised; the core already re-formed the process
  group on the same workers): run the loop again.
- :class:`Restart`: workers died and their resources are there (the placement-group bundle of a
  dead rank is still placed: a killed process, an OOM): ``group.restart()`` starts fresh workers
  in the same places; live workers keep their processes (torch stays imported).
- :class:`Resize`: elastic runs only: a dead rank's bundle is not placed again within
  ``ELASTIC_WAIT_S`` (its node is gone): ``group.rescale(survivors)``, not below ``min``. Also
  used to grow (:func:`growth`) when resources come back: the bundle of a lost rank is placed
  again, or the cluster has room for another worker.
- :class:`Recreate`: nothing alive to keep: a new group.

Every decision is followed by a new run of the loop, which resumes from the newest committed
checkpoint (``get_checkpoint()``).
"""
from __future__ import annotations

import dataclasses
import logging
import math
from typing import TYPE_CHECKING, Dict, List, Union

from .. import settings
from ..errors import ResourceError, WorkerError
from ..group.placement import await_bundles, bundles_placed
from ..group.retiring import retire

if TYPE_CHECKING:
    from ..group.group import WorkerGroup
    from .config import ScalingConfig

logger = logging.getLogger(__name__)

#: How long to wait for a lost worker's resources before an elastic run continues without it (read once, here).
ELASTIC_WAIT_S = settings.elastic_wait_s()
#: How long a fixed-size run waits for a lost worker's resources before it fails (read once, here).
RESOURCE_WAIT_S = settings.resource_wait_s()


@dataclasses.dataclass(frozen=True)
class Retry:
    reason: str


@dataclasses.dataclass(frozen=True)
class Restart:
    ranks: List[int]
    reason: str


@dataclasses.dataclass(frozen=True)
class Resize:
    num_workers: int
    reason: str


@dataclasses.dataclass(frozen=True)
class Recreate:
    num_workers: int
    reason: str


Decision = Union[Retry, Restart, Resize, Recreate]


def dead_ranks(exc: WorkerError) -> List[int]:
    """Ranks whose worker process died or stopped answering."""
    return sorted({death.rank for death in exc.deaths})


def _gone(group: "WorkerGroup") -> List[int]:
    return group.slots.gone_ranks()


def _places_ready(group: "WorkerGroup", ranks: List[int], wait_s: float) -> bool:
    """Whether the places of dead ``ranks`` can take new workers within ``wait_s``.

    The dead workers are retired first (:func:`.retiring.retire`): until Ray declares a lost node
    dead, its bundles still look placed.
    """
    slots = [group.slots[r] for r in ranks]
    retire(slots)
    return await_bundles([(s.pg, s.bundle) for s in slots], wait_s)


def decide(group: "WorkerGroup", exc: WorkerError, scaling: "ScalingConfig") -> Decision:
    """The recovery for a failed attempt (see the module docstring)."""
    group.status()  # a death Ray knows of but the monitor has not marked yet counts
    dead = sorted(set(dead_ranks(exc)) | set(_gone(group)))
    alive = group.num_workers - len(dead)
    if not dead:
        return Retry("the training function raised; every worker is alive")
    if alive == 0:
        return Recreate(group.num_workers, "every worker died")
    wait = ELASTIC_WAIT_S if scaling.elastic else RESOURCE_WAIT_S
    if _places_ready(group, dead, wait):
        return Restart(dead, f"rank(s) {', '.join(map(str, dead))} died; their resources are free")
    if scaling.elastic and alive >= scaling.min_workers:
        return Resize(alive, f"rank(s) {', '.join(map(str, dead))} died and their resources did not come back "
                             f"within {wait:g} s: continuing with {alive} worker(s)")
    need = "" if not scaling.elastic else f" (at least {scaling.min_workers} needed)"
    raise ResourceError(f"rank(s) {', '.join(map(str, dead))} died and their resources did not come back within "
                        f"{wait:g} s{need}: the node is probably gone; add resources to the cluster, or use an "
                        "elastic ScalingConfig(num_workers=(min, max))")


def carry_out(group: "WorkerGroup", decision: Decision) -> None:
    """Act on a decision (never for :class:`Recreate`, which the trainer does by starting a group).

    The group's restart and rescale first settle the reported checkpoints the failure left, so the
    next attempt resumes from the newest complete one.
    """
    if isinstance(decision, Restart):
        group.restart()
    elif isinstance(decision, Resize):
        group.rescale(decision.num_workers)


def _fits(resources: Dict[str, float], bundle: Dict[str, float]) -> int:
    counts = [math.floor(resources.get(k, 0.0) / v + 1e-9) for k, v in bundle.items() if v > 0]
    return min(counts) if counts else 0


def growth(group: "WorkerGroup", scaling: "ScalingConfig") -> int:
    """How many workers an elastic run could add now (0 when at ``max`` or nothing is free)."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    room = scaling.max_workers - group.num_workers
    if not scaling.elastic or room <= 0:
        return 0
    # group.rescale() fills the places of lost workers that are placed again first. While one
    # is still waiting for a node, free resources are not counted: Ray gives them to that place.
    placed = bundles_placed(list(group.slots.free))
    if not all(placed):
        return min(room, sum(placed))
    return min(room, len(placed) + _fits(ray.available_resources(), group.config.placement_bundle()))


def start_size(scaling: "ScalingConfig", bundle: Dict[str, float]) -> int:
    """Workers to start an elastic run with: as many as fit now, between ``min`` and ``max``."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    if not scaling.elastic:
        return scaling.max_workers
    fits = _fits(ray.available_resources(), bundle or {"CPU": 0.001})
    return max(scaling.min_workers, min(scaling.max_workers, fits))
