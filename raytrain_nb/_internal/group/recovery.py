"""Replacing dead workers and resizing a live group, keeping the warm state.

``restart``, ``rescale`` and ``replace_ranks`` look at the group, make a plan (``plans.py``: the steps as
data) and have the one executor (``executor.py``) carry it out; ``recover_and_retry`` is ``--on-failure``.
Every way in (the magics, the dashboard's buttons, ``--on-failure``, ``fit()``'s failure handling through
``WorkerGroup.restart`` / ``rescale``) ends here.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, List

from ..errors import WorkerError
from .executor import carry_out
from .liveness import ping
from .plans import RecoveryPlan, check_size, plan_recovery
from .policy import FailurePolicy
from .policy import carry_out as policy_carry_out

if TYPE_CHECKING:  # handed in; never imported here at run time
    from .core import GroupCore
    from .formation import Formation
    from .group import WorkerGroup

logger = logging.getLogger(__name__)

ON_FAILURE = ("raise", "restart", "rescale")


def plan_for(core: "GroupCore", operation: str, **how: Any) -> RecoveryPlan:
    """The plan for ``operation`` on the group of ``core`` as it is now (``how``: as ``plan_recovery`` takes)."""
    slots = core.slots
    unmirrored, why = core.mirrors.unmirrored(core)
    return plan_recovery(core.kind, operation, live=slots.live_ranks(), gone=slots.gone_ranks(),
                         spares=len(slots.spares), free_places=len(slots.free), carried=core.carried is not None,
                         sharded=core.mirrors.sharded, unmirrored=unmirrored, unmirrored_why=why, **how)


def replace_ranks(core: "GroupCore", formation: "Formation", ranks: List[int]) -> None:
    """New actors in the places of ``ranks`` (live ones stuck in user code); state from the lowest other rank."""
    plan = plan_for(core, "replace", replace=ranks)
    carry_out(core, formation, plan)
    logger.info("replaced rank(s) %s; state copied from rank %s", list(ranks), plan.src)


def restart(core: "GroupCore", formation: "Formation", from_checkpoint: bool = False) -> List[int]:
    """Replace every dead or unresponsive rank (see ``WorkerGroup.restart``); returns those ranks."""
    core.check_not_running()
    ping(core)  # a death Ray knows of but the monitor has not seen yet counts
    dead = core.slots.gone_ranks()
    plan = plan_for(core, "restart", from_checkpoint=from_checkpoint)
    carry_out(core, formation, plan, from_checkpoint)
    logger.info("replaced rank(s) %s; state %s", dead, f"copied from rank {plan.src}" if plan.src is not None
                else "from the state handed over" if core.kind.fresh_processes and not from_checkpoint
                else "from their replayed cells, then the checkpoint")
    return dead


def rescale(core: "GroupCore", formation: "Formation", num_workers: int) -> None:
    """Grow or shrink the group to ``num_workers`` (see ``WorkerGroup.rescale``)."""
    core.check_not_running()
    check_size(num_workers)  # at once, before any worker is asked anything
    ping(core)  # a death Ray knows of but the monitor has not seen yet counts
    carry_out(core, formation, plan_for(core, "rescale", num_workers=num_workers))
    logger.info("%s %d workers%s", "renewed" if core.kind.fresh_processes else "rescaled to", num_workers,
                " (fresh processes for every rank)" if core.kind.fresh_processes else "")


def recover_and_retry(group: "WorkerGroup", exc: Exception, mode: str, attempt: int, max_failures: int,
                      sink: Any) -> bool:
    """Apply ``--on-failure`` (the group's one failure policy, ``policy.py``): recover from dead workers and say
    so; False to re-raise (``raise``, no worker died, every worker died, or no tries left)."""
    if mode == "raise" or not isinstance(exc, WorkerError) or not exc.deaths or (0 <= max_failures <= attempt):
        return False
    decision = FailurePolicy(mode).decide(group, exc)
    if decision is None:
        return False
    limit = "no limit" if max_failures < 0 else f"{attempt + 1}/{max_failures}"
    ranks = ", ".join(str(d.rank) for d in exc.deaths)
    sink.notice(f"rank(s) {ranks} died ({exc.deaths[0].cause}); --on-failure {mode} ({limit}): recovering, then "
                "running the cell again")
    policy_carry_out(group, decision)
    if group.rank_values is not None and group.rank_values.summary():
        sink.notice(group.rank_values.summary())  # rank, world_size...: what was re-evaluated, what was not
    return True
