"""What a sharded (FSDP2) group's buddy mirrors hold, as the soak follows it: the state a recovery must bring back.

The product mirrors every rank's shards to a buddy after each whole-group cell that trained, each snapshot between
cells, each rollback and each recovery; a restart or rescale re-shards every rank from those mirrors, so the model
comes back *at the last mirror point* (README, "No shard lost with a rank"), even where the live ranks had trained
further in a cell that failed. When a lost rank's mirror went with its buddy, or a live rank trained since the
mirror its lost buddy kept, the recovery is refused in one line (``plans.LOST_SHARDS``) offering ``--from-checkpoint``.

:class:`MirrorWatch` is told every operation's outcome (``Runner.record``) and every fault, and after each step
(``Runner.after_step``) the state rank 0's digests show. It knows the mirror point (the digests after the last
operation that refreshed the mirrors, unless a fault fired while it ran), whether any rank may have trained since
(``clean``), and whether a recovery from the mirrors ran; so the runner can check that a recovery brought back
exactly the mirror point, and tell an expected refusal from one that should not have happened.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from raytrain_nb._internal.group.mirrors import UNSETTLED  # noqa: F401 - the soak recovers from it (runner.py)
from raytrain_nb._internal.group.plans import LOST_SHARDS

#: The start of the product's one-line refusal when a rank's shards are gone with it and its buddy.
LOST_PREFIX = LOST_SHARDS.split("{ranks}")[0]

#: Operations that neither change the training state nor refresh the mirrors.
QUIET = frozenset({"digests", "status", "shutdown", "start", "setup", "bg-start", "checkpoint-during-bg",
                   "interrupt-bg"})
#: Snapshots: on success they refresh the mirrors; a failed one changed nothing.
SNAPSHOTS = frozenset({"checkpoint", "checkpoint-async", "kill-during-checkpoint", "stop-during-checkpoint"})
#: Restarts and rescales: on a sharded group every one re-shards from the mirrors, then refreshes them.
FROM_MIRRORS = frozenset({"restart", "rescale-up", "rescale-down", "rescale-same", "kill-during-rescale",
                          "stop-during-rescale", "kill-during-restart", "recover-restart", "recover-rescale"})
FROM_SNAPSHOT = "recover-restart-from-snapshot"
#: The refusals that come before a recovery touches any worker (nothing changed).
REFUSED_UNTOUCHED = (LOST_PREFIX, "no dead worker to restart", "is not possible: give a whole number")


def lost_shards(message: str) -> bool:
    """Whether ``message`` is the product's refusal for shards that are gone (``plans.LOST_SHARDS``)."""
    return LOST_PREFIX in message and "--from-checkpoint" in message


class MirrorWatch:
    """The soak's view of a sharded group's mirrors (one per episode of a sharded style).

    Attributes:
        point: rank 0's digests at the last mirror point; None when unknown (a fault hit a refresh).
        clean: no rank can have trained since the mirror point (a refusal after one death is then a violation).
        recovered: a recovery from the mirrors succeeded in this step (the state must be the mirror point).
        refusals: the recoveries refused because shards were gone.

    Args:
        checks: the soak's counter of checks made (``Stats.checks``).
    """

    def __init__(self, checks: Any) -> None:
        self.checks = checks
        self.point: Optional[Dict[str, str]] = None
        self.clean = False
        self.recovered = False
        self.refusals = 0
        self._pending = False  # an operation refreshed the mirrors in this step: the point is the state after it
        self._last: Optional[Dict[str, str]] = None  # rank 0's digests at the end of the last step (None: unknown)
        self._faulted = False  # a fault fired in this step (a refresh after it may have failed, quietly)

    def fault(self) -> None:
        """A fault fired (a kill, or a stop) in this step."""
        self._faulted = True

    def op(self, op: str, ok: bool, message: str = "") -> None:
        """An operation's outcome (its name as ``Runner.record`` counts it)."""
        if op in QUIET:
            return
        if ok:
            if op in FROM_MIRRORS or op == FROM_SNAPSHOT:  # the recovery's own refresh raises when it fails
                self.recovered = op in FROM_MIRRORS
                self._pending, self.clean, self._faulted = True, True, False
            elif self._faulted:  # its refresh may have met the fault and given up, logging only
                self.point, self.clean, self._pending = None, False, False
            elif op in SNAPSHOTS:  # a snapshot changes no state: its refresh mirrored the state the last step left
                self.point, self.clean, self._pending = self._last, True, True  # (a fault may come after it)
            else:
                self._pending, self.clean = True, True
            return
        if op in SNAPSHOTS or any(r in message for r in REFUSED_UNTOUCHED):
            return  # nothing trained, nothing re-sharded
        if op in FROM_MIRRORS or op == FROM_SNAPSHOT:  # stopped part-way: the shards may be anything now
            self.point, self._pending = None, False
        self.clean = False  # a cell may have stepped before it failed; the mirrors stay at the point

    def refusal_expected(self, gone: List[int], size: int) -> bool:
        """Whether a refusal for lost shards fits what the soak knows: two ranks or more gone (a rank and its
        buddy, in a group of three or fewer), a rank that trained since the mirror point, or a point unknown."""
        self.refusals += 1
        return len(gone) > 1 or size < 2 or not self.clean or self.point is None

    def end_step(self, rank0: Optional[Dict[str, str]]) -> Optional[str]:
        """After a step, with rank 0's digests (None when they could not be read). Returns a violation's detail
        when a recovery from the mirrors brought back other state than the mirror point."""
        problem = None
        if rank0 is not None and self.recovered and self.point is not None:
            differ = sorted(p for p, d in self.point.items() if p in rank0 and rank0[p] != d)
            self.checks["sharded: recoveries from the mirrors compared with the mirror point"] += 1
            if differ:
                problem = (f"after a restart or rescale from the buddy mirrors, {', '.join(differ)} "
                           "are not the state of the last mirror point")
        if self._pending:
            self.point = dict(rank0) if rank0 is not None else None
        self._last = dict(rank0) if rank0 is not None else None
        self.recovered = self._pending = self._faulted = False
        return problem
