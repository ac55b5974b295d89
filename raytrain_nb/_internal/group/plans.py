"""Recovery as data: what a restart or rescale will do, decided before anything is touched.

:func:`plan_recovery` looks at the group (its kind, which ranks live, its spares) and the operation
asked for, and returns a :class:`RecoveryPlan`: the ranks kept, dropped and new, the rank new ones copy
from, and the steps in order. ``recovery.py`` carries out every plan with one executor; the magics, the
buttons, ``--on-failure`` and ``fit()`` all reach it through ``WorkerGroup.restart`` / ``rescale``. Plans
are pure: they are unit-tested without Ray for every kind.

A restart of rank 1 of a torch group with no spare, as a plan::

    Retire(ranks=(1,), await_deaths=True)   Ray records the death, then the worker is killed
    AwaitPlaces(ranks=(1,))                 its place is back on a live node
    Spawn(ranks=(1,), spares=0)             a new actor in that place
    Replay(ranks=(1,))                      setup cells (and imports, defs) replayed, collectives deferred
    Join(src=0, ranks=(1,))                 every rank re-forms the process group; DDP re-wrapped
    Rebind()                                rank values (rank, world_size, ctx...) set again on every rank

A group whose kind has no process group copies through the driver after joining
(``CopyFromPeer(src=0, ranks=(1,))``); one whose kind needs fresh processes (TensorFlow) carries the lowest
live rank's state first (``Carry``), replaces every rank, and loads it last (``LoadCarried``).
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence, Tuple, Union

from ..errors import GroupError
from .kinds import GroupKind

NO_SOURCE = ("no live worker is left to copy the state from: restart from a checkpoint (%dist_restart "
             "--from-checkpoint NAME, group.restart(from_checkpoint=...)), or start a new group and roll back to one")


LOST_SHARDS = ("the shards of rank(s) {ranks} are gone: {why}; restart from a snapshot (%dist_restart "
               "--from-checkpoint NAME, group.restart(from_checkpoint=...))")


@dataclasses.dataclass(frozen=True)
class Retire:
    """Kill the workers of ``ranks`` (old numbering); with ``await_deaths`` Ray first records the dead ones
    as dead (their places are reused: until then a lost node's places look usable)."""

    ranks: Tuple[int, ...]
    await_deaths: bool


@dataclasses.dataclass(frozen=True)
class AwaitPlaces:
    """Wait until the places of ``ranks`` are on live nodes (Ray moves a lost node's bundles)."""

    ranks: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Reserve:
    """Reserve ``count`` more places (a placement group) before anything is touched: fail fast."""

    count: int


@dataclasses.dataclass(frozen=True)
class Spawn:
    """New workers for ``ranks`` (new numbering): the first ``spares`` from standby workers."""

    ranks: Tuple[int, ...]
    spares: int = 0


@dataclasses.dataclass(frozen=True)
class Carry:
    """Before fresh processes replace every rank: rank ``src`` hands its tracked state to the driver."""

    src: int


@dataclasses.dataclass(frozen=True)
class Replay:
    """Set the new ranks up without joining, then replay the group's cells on them."""

    ranks: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Join:
    """Every rank re-forms the group (and re-binds DDP wrappers and samplers to it); new ``ranks`` get what
    they lack from ``src`` inside the process group (None: every rank is new, nothing is copied)."""

    src: Optional[int]
    ranks: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class CopyFromPeer:
    """After joining, where no process group carries state: ``ranks`` get ``src``'s through the driver."""

    src: int
    ranks: Tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class LoadCarried:
    """Load the state carried from the old processes into every (fresh) rank."""


@dataclasses.dataclass(frozen=True)
class GatherMirrors:
    """A sharded group, before anything is touched: every old rank's newest mirror of its shards, from the buddy
    that keeps it (``group/mirrors.py``); a rank whose mirror is gone fails the plan here."""


@dataclasses.dataclass(frozen=True)
class Reshard:
    """A sharded group, after joining: every rank shards its sharded models again over the new process group,
    in place, filled from the gathered mirrors (``from_mirrors``) or left for the checkpoint loaded next; then
    every rank's mirror goes to its new buddy."""

    from_mirrors: bool


@dataclasses.dataclass(frozen=True)
class Rebind:
    """On every rank (survivors too): set again the notebook's values that come only from the rank's context
    (``rank``, ``world_size``, ``ctx``...), and name those computed from them (``group/rank_refresh.py``)."""


Step = Union[Retire, AwaitPlaces, Reserve, Spawn, Carry, Replay, Join, CopyFromPeer, LoadCarried, Rebind, GatherMirrors,
             Reshard]


@dataclasses.dataclass(frozen=True)
class RecoveryPlan:
    """What a restart or rescale does.

    Attributes:
        operation: ``restart`` or ``rescale``.
        num_workers: the group's size afterwards.
        keep: old ranks kept, in their new order (new rank ``i`` is ``keep[i]``); in place (a restart of some
            ranks), every rank that is not replaced keeps its number.
        drop: old ranks whose workers go.
        new_ranks: ranks (new numbering) that get a new worker.
        src: the rank new ones copy from (new numbering), or None when none does.
        in_place: new workers take the ranks (and places) of the ones they replace.
        steps: what to do, in order.
    """

    operation: str
    num_workers: int
    keep: Tuple[int, ...]
    drop: Tuple[int, ...]
    new_ranks: Tuple[int, ...]
    src: Optional[int]
    in_place: bool
    steps: Tuple[Step, ...]

    def describe(self) -> str:
        """One line per step, for logs and for the curious."""
        return "\n".join(repr(step) for step in self.steps)


def _after_join(kind: GroupKind, src: Optional[int], new: Tuple[int, ...], sharded: bool = False,
                from_checkpoint: bool = False) -> Tuple[Step, ...]:
    copy: Tuple[Step, ...] = (CopyFromPeer(src, new),) if kind.copies_through_driver and src is not None and new \
        else ()
    reshard: Tuple[Step, ...] = (Reshard(from_mirrors=not from_checkpoint),) if sharded else ()
    return reshard + copy + (Rebind(),)


def check_size(num_workers: object) -> int:
    """``num_workers`` if it is a size a group can have.

    Raises:
        GroupError: not a whole number of at least 1, naming it.
    """
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise GroupError(f"rescale to {num_workers!r} workers is not possible: give a whole number of at least 1")
    return num_workers


def plan_recovery(kind: GroupKind, operation: str, *, live: Sequence[int], gone: Sequence[int],
                  num_workers: Optional[int] = None, spares: int = 0, free_places: int = 0,
                  from_checkpoint: bool = False, carried: bool = False,
                  replace: Sequence[int] = (), sharded: bool = False, unmirrored: Sequence[int] = (),
                  unmirrored_why: str = "") -> RecoveryPlan:
    """The plan of a restart (the gone ranks replaced), a rescale to ``num_workers``, or the replacement of the
    live ranks in ``replace`` (ranks stuck in user code that did not stop: fresh workers take their places).

    Args:
        kind: the group's kind.
        operation: ``restart``, ``rescale`` or ``replace``.
        live, gone: the group's ranks now, alive and dead (or unresponsive).
        num_workers: the size asked for (rescale).
        spares: standby workers ready to take a rank.
        free_places: places reserved and unused (from earlier shrinks).
        from_checkpoint: a checkpoint is loaded afterwards, so no live rank is needed.
        carried: state handed over before an earlier renewal failed is kept on the group (fresh processes).
        sharded: the group holds sharded (FSDP2) models: mirrors are gathered first and every rank re-shards.
        unmirrored: ranks whose mirror of their shards is gone (``unmirrored_why`` says why); one of them gone
            too fails the plan unless ``from_checkpoint``.

    Raises:
        GroupError: nothing to restart, no live worker to copy from, or a bad size, naming the fix.
    """
    live, gone = tuple(sorted(live)), tuple(sorted(gone))
    size = len(live) + len(gone)
    if operation == "replace":
        live, gone = tuple(r for r in live if r not in replace), tuple(sorted(set(gone) | set(replace)))
    if operation in ("restart", "replace"):
        if not gone:
            raise GroupError("no dead worker to restart: every rank is alive (%dist_status shows them)")
        target = size
    elif operation == "rescale":
        target = check_size(num_workers)
        if not live and not (kind.fresh_processes and carried):
            raise GroupError("every worker is dead: nothing to keep; shut the group down and start a new one")
    else:
        raise GroupError(f"operation={operation!r} is unknown: restart or rescale")
    if not live and not from_checkpoint and not (kind.fresh_processes and carried):
        raise GroupError(NO_SOURCE)
    lost = sorted(set(unmirrored) & set(gone))
    if sharded and lost and not from_checkpoint:
        raise GroupError(LOST_SHARDS.format(ranks=", ".join(map(str, lost)), why=unmirrored_why or "no mirror"))
    first: Tuple[Step, ...] = (GatherMirrors(),) if sharded and not from_checkpoint else ()

    if operation == "replace" or (operation == "restart" and not kind.fresh_processes):  # in place
        src = live[0] if live else None
        steps: Tuple[Step, ...] = first + (Retire(gone, await_deaths=len(gone) > spares),)
        if len(gone) > spares:
            steps += (AwaitPlaces(gone[spares:]),)
        steps += (Spawn(gone, spares=min(spares, len(gone))), Replay(gone), Join(src, gone))
        return RecoveryPlan(operation, target, live, gone, gone, src, True,
                            steps + _after_join(kind, src, gone, sharded, from_checkpoint))

    # A resize (also every restart of a kind that needs fresh processes): the live workers stay, the lowest
    # ranks first, and new ones join them; with fresh processes every rank is new.
    keep = () if kind.fresh_processes else live[:target]
    drop = tuple(r for r in live if r not in keep) + gone
    new = tuple(range(len(keep), target))
    steps = first
    if kind.fresh_processes and not from_checkpoint:
        steps += (Carry(live[0]),) if live else ()
    extra = len(new) - len(drop) - free_places
    if extra > 0:
        steps += (Reserve(extra),)
    steps += (Retire(drop, await_deaths=bool(new)),)
    if new:
        steps += (Spawn(new), Replay(new))
    src = None if kind.fresh_processes or not keep else 0
    steps += (Join(src, new),)
    if kind.fresh_processes and not from_checkpoint:
        return RecoveryPlan(operation, target, keep, drop, new, src, False, steps + (LoadCarried(), Rebind()))
    return RecoveryPlan(operation, target, keep, drop, new, src, False,
                        steps + _after_join(kind, src, new, sharded, from_checkpoint))
