"""What a trainer does after a failed attempt, and when an elastic run grows: decisions as data.

:func:`decide` asks the group's one failure policy (``group/policy.py``, which cells' ``--on-failure``
uses too) for one small decision; :func:`~raytrain_nb._internal.group.policy.carry_out` is the one place that acts on it, through the group's
public methods:

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

import logging
import math
from typing import TYPE_CHECKING, Dict

from .. import settings
from ..errors import WorkerError
from ..group.placement import bundles_placed
from ..group.policy import Decision, FailurePolicy

if TYPE_CHECKING:
    from ..group.group import WorkerGroup
    from .config import ScalingConfig

logger = logging.getLogger(__name__)

#: How long to wait for a lost worker's resources before an elastic run continues without it (read once, here).
ELASTIC_WAIT_S = settings.elastic_wait_s()
#: How long a fixed-size run waits for a lost worker's resources before it fails (read once, here).
RESOURCE_WAIT_S = settings.resource_wait_s()


def decide(group: "WorkerGroup", exc: WorkerError, scaling: "ScalingConfig") -> Decision:
    """The recovery for a failed attempt of ``fit()``: the group's one failure policy (``group/policy.py``),
    set for a trainer: a loop that raised runs again, a group with no live worker is made anew, a dead rank's
    place may take ``RESOURCE_WAIT_S`` to come back (``ELASTIC_WAIT_S`` for an elastic run, which then goes on
    with the survivors, down to ``min``)."""
    policy = FailurePolicy("restart", retry_raised=True, recreate=True,
                           wait_s=ELASTIC_WAIT_S if scaling.elastic else RESOURCE_WAIT_S,
                           min_workers=scaling.min_workers if scaling.elastic else None)
    decision = policy.decide(group, exc)
    assert decision is not None  # retry_raised and recreate: every failure has a decision
    return decision


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
    placed = bundles_placed(list(group.free_places))
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
