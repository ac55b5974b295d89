"""After the group re-forms: every rank re-evaluates the notebook's rank values, and the summary says which."""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, List

from ..errors import first_line
from ..worker.rank_values import plan_rank_values
from .fanout import FANOUT
from .timing import CONTROL_START_S

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RankValues:
    """What the latest restart or rescale did with the notebook's rank values (``group.rank_values``).

    Attributes:
        reevaluated: names set again on every rank from its new context (``rank``, ``world_size``, ``ctx``).
        dependents: names computed from those that were not re-evaluated (``is_main = rank == 0``): run
            their cells again.
        failed: one line per rank and name that could not be re-evaluated, with the reason.
    """

    reevaluated: List[str] = dataclasses.field(default_factory=list)
    dependents: List[str] = dataclasses.field(default_factory=list)
    failed: List[str] = dataclasses.field(default_factory=list)

    def summary(self) -> str:
        """One line of what was re-evaluated and what was not (then one per failure); "" when nothing."""
        parts = []
        if self.reevaluated:
            parts.append(f"re-evaluated on every rank: {', '.join(self.reevaluated)}")
        if self.dependents:
            parts.append("computed from them, not re-evaluated (run their cells again): "
                         f"{', '.join(self.dependents)}")
        lines = ["; ".join(parts)] if parts else []
        lines += [f"not re-evaluated on {line}" for line in self.failed]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.summary()


def refresh_rank_values(core: "GroupCore") -> RankValues:
    """Have every rank of the re-formed ``group`` run again the assignments of its cell history whose value
    is only the rank's context (``worker/rank_values.py`` chooses them), all at once under one deadline.

    Never raises: a rank that fails or does not answer is named in :attr:`RankValues.failed`. The result is
    also kept as ``group.rank_values``.
    """
    try:
        plan = plan_rank_values([record.source for record in core.history])
    except Exception as exc:  # noqa: BLE001 - a recovery that worked is not failed by its summary
        logger.warning("could not tell which values are rank values: %s", exc, exc_info=True)
        plan = None
    if plan is None:
        result = RankValues()
    elif not plan.statements:
        result = RankValues(dependents=list(plan.dependents))
    else:
        result = _ask(core, list(plan.statements), list(plan.names), list(plan.dependents))
    core.rank_values = result
    if result.summary():
        logger.info("%s", result.summary())
    return result


def _ask(core: "GroupCore", statements: List[str], names: List[str], dependents: List[str]) -> RankValues:
    replies = FANOUT.ask(list(core.slots), lambda s: s.actor.refresh_rank_values.remote(statements, names),
                         CONTROL_START_S, "every rank to re-evaluate its rank values (rank, world size...)")
    failed, missed = [], set()
    for reply in replies:
        if not reply.ok:
            reason = "no answer in time" if reply.error is None else \
                f"{type(reply.error).__name__}: {first_line(reply.error)}"
            failed.append(f"rank {reply.rank}: {', '.join(names)} ({reason})")
            missed.update(names)
            continue
        for name, reason in reply.value["failed"].items():
            failed.append(f"rank {reply.rank}: {name} ({reason})")
            missed.add(name)
    for line in failed:
        logger.warning("not re-evaluated on %s", line)
    return RankValues([n for n in names if n not in missed], dependents, failed)
