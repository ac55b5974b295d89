"""What to do after a failure, as data: the one failure policy of cells (``--on-failure``) and of ``fit()``.

:meth:`FailurePolicy.decide` looks at the failure and the group and returns one small decision;
:func:`carry_out` is the one place that acts on it, through the group's public methods (which make a
recovery plan, ``plans.py``):

- :class:`Retry`: every worker is alive (the code raised; the group already re-formed its process
  group on the same workers): run it again (``fit()``; a cell re-raises instead).
- :class:`Restart`: workers died and their places can take new ones (a killed process, an OOM):
  ``group.restart()`` starts fresh workers there; live workers keep their processes and state.
- :class:`Resize`: continue with the survivors (``--on-failure rescale``; or, with ``min_workers``, when
  a dead rank's place did not come back within ``wait_s``: its node is gone). Also how an elastic
  ``fit()`` grows when resources come back.
- :class:`Recreate`: nothing alive to keep: a new group (``fit()`` only).
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, List, Optional, Union

from ..errors import ResourceError, WorkerError
from .placement import await_bundles
from .retiring import retire

if TYPE_CHECKING:  # the group calls in here; this module never imports it at run time
    from .group import WorkerGroup


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


@dataclasses.dataclass(frozen=True)
class FailurePolicy:
    """How a group recovers from a failed cell or training attempt.

    Attributes:
        mode: ``restart`` (replace the dead ranks) or ``rescale`` (continue with the survivors).
        retry_raised: a failure with every worker alive is retried (``fit()``); otherwise it is re-raised.
        recreate: with every worker dead, start a new group (``fit()``); otherwise it is re-raised.
        wait_s: how long a dead rank's place may take to take a new worker before the policy goes on without
            it (None: the restart itself waits for it, up to the group's ``placement_timeout_s``).
        min_workers: going on without lost ranks is allowed down to this many; None: it is an error.
    """

    mode: str = "restart"
    retry_raised: bool = False
    recreate: bool = False
    wait_s: Optional[float] = None
    min_workers: Optional[int] = None

    def decide(self, group: "WorkerGroup", exc: WorkerError) -> Optional[Decision]:
        """The recovery for ``exc``, or None when it is to be raised as it is.

        Raises:
            ResourceError: dead ranks' places did not come back within ``wait_s`` and going on with fewer
                workers is not allowed (or would be fewer than ``min_workers``).
        """
        gone = [w.rank for w in group.status() if w.state.gone]  # status() pings: a death Ray knows of counts
        dead = sorted({d.rank for d in exc.deaths} | set(gone))
        names = ", ".join(map(str, dead))
        alive = group.num_workers - len(dead)
        if not dead:
            return Retry("the training function raised; every worker is alive") if self.retry_raised else None
        if alive == 0:
            return Recreate(group.num_workers, "every worker died") if self.recreate else None
        if self.mode == "rescale":
            return Resize(alive, f"rank(s) {names} died: continuing with {alive} worker(s)")
        if self.wait_s is None:
            return Restart(dead, f"rank(s) {names} died: replacing them")
        if _places_ready(group, dead, self.wait_s):
            return Restart(dead, f"rank(s) {names} died; their resources are free")
        if self.min_workers is not None and alive >= self.min_workers:
            return Resize(alive, f"rank(s) {names} died and their resources did not come back within "
                                 f"{self.wait_s:g} s: continuing with {alive} worker(s)")
        need = "" if self.min_workers is None else f" (at least {self.min_workers} needed)"
        raise ResourceError(f"rank(s) {names} died and their resources did not come back within {self.wait_s:g} s"
                            f"{need}: the node is probably gone; add resources to the cluster, or use an elastic "
                            "ScalingConfig(num_workers=(min, max))")


def _places_ready(group: "WorkerGroup", ranks: List[int], wait_s: float) -> bool:
    """Whether the places of dead ``ranks`` can take new workers within ``wait_s``. The dead workers are retired
    first: until Ray declares a lost node dead, its bundles still look placed."""
    slots = [group.slots[r] for r in ranks]
    retire(slots)
    return await_bundles([(s.pg, s.bundle) for s in slots], wait_s)


def carry_out(group: "WorkerGroup", decision: Decision) -> None:
    """Act on a decision (never for :class:`Retry` or :class:`Recreate`, which the caller does by running
    again or starting a group). The group's restart and rescale first settle the reported checkpoints the
    failure left, so the next attempt resumes from the newest complete one."""
    if isinstance(decision, Restart):
        group.restart()
    elif isinstance(decision, Resize):
        group.rescale(decision.num_workers)
