"""Buddy mirrors: every rank's newest copy of its shards kept in a peer's memory, so no shard is lost with a rank.

Under full sharding (FSDP2) a rank's shards exist nowhere else. At the end of each whole-group cell that trained
and on every snapshot, each rank ``r`` takes a mirror of its shards and rank ``(r + 1) % N`` (its buddy) keeps it;
the mirror goes from rank to buddy through Ray's object store, never through the driver's memory. A restart or
rescale of a sharded group first gathers every old rank's mirror (:meth:`Mirrors.gather`, before any worker is
touched), then, once the process group re-formed, every rank re-shards from them (the plan's ``Reshard`` step).

Cost: each rank holds its buddy's shards besides its own (about twice the memory of its share of parameters and
optimizer state), and each training cell ends with one copy of every rank's shards. ``WorkerGroup.mirror_shards(
False)`` turns it off; then a lost rank of a sharded group is restored only from a snapshot.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ..errors import GroupError
from ..waits import wait_within
from . import timing
from .plans import LOST_SHARDS

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)



#: ``%dist_pull`` / ``group.pull`` of a sharded model gathers its full state dict only up to this size (every rank
#: holds the whole model for a moment, and the driver receives it); above it the pull is refused.
PULL_GATHER_MAX_BYTES = 2 * 2**30


def pull_sharded(core: "GroupCore", refusal: Any, rank: Optional[int]) -> Any:
    """``group.pull`` of a sharded model: its gathered full state dict (CPU tensors) from ``rank`` (a list from
    every rank with None), when the model is at most :data:`PULL_GATHER_MAX_BYTES`.

    Raises:
        GroupError: the model is larger (one line naming its size and the way to gather it from a snapshot).
    """
    name, total = refusal.name, refusal.share["total_bytes"]
    if total > PULL_GATHER_MAX_BYTES:
        raise GroupError(f"{name!r} is sharded over {refusal.share['mesh_size']} ranks and holds "
                         f"{total / 2**20:.0f} MiB, more than the {PULL_GATHER_MAX_BYTES / 2**20:.0f} MiB a pull "
                         "gathers: take a snapshot (%dist_checkpoint) and gather it in one process with "
                         "raytrain_nb.torch.dcp_to_torch_save(<snapshot>/sharded, 'model.pt')")
    core.check_usable()
    full = core.collect([s.actor.gather_full.remote(name, 0 if rank is None else rank) for s in core.slots],
                        timing.SNAPSHOT_WRITE_S, f"gather the sharded {name!r} of")
    value = full[0 if rank is None else rank]
    return [value] * len(full) if rank is None else value


class Mirrors:
    """Which worker keeps each rank's newest mirror, and what the last refresh cost."""

    def __init__(self) -> None:
        self.enabled = True
        self.sharded = False  # the group holds a sharded model (known from the last refresh)
        self.holders: Dict[int, Any] = {}  # rank (at the last refresh) -> the actor keeping its mirror
        self.world = 0
        self.last_bytes = 0
        self.last_s = 0.0
        self.shares: List[int] = []  # each rank's bytes of shards (parameters and optimizer state) at the refresh

    def refresh(self, core: "GroupCore") -> None:
        """Every rank's mirror to its buddy now (a no-op where nothing is sharded or the switch is off)."""
        if not self.enabled:
            return
        slots = list(core.slots)
        n = len(slots)
        started = time.perf_counter()
        takes = [s.actor.mirror_take.remote() for s in slots]
        keeps = [slots[(r + 1) % n].actor.mirror_keep.remote(r, takes[r]) for r in range(n)]
        sizes = core.collect(keeps, timing.SNAPSHOT_WRITE_S, "keep each rank's mirror of its shards on its buddy in")
        self.sharded = any(sizes)
        self.holders = {r: slots[(r + 1) % n].actor for r in range(n)} if self.sharded else {}
        self.world = n if self.sharded else 0
        self.last_bytes, self.last_s = sum(sizes), time.perf_counter() - started
        self.shares = list(sizes) if self.sharded else []
        if self.sharded:
            logger.debug("mirrored %d bytes of shards in %.3f s", self.last_bytes, self.last_s)

    def after_cell(self, core: "GroupCore", trained: bool, stepped: bool) -> None:
        """After a whole-group cell: mirror when a rank says its sharded models changed since their mirror
        (``stepped``, :attr:`CellOutcome.shards_stepped`: a new sharded model, or its optimizer stepped, however
        the model was sharded), or when the cell trained a group already known sharded. A plain DDP group pays
        nothing per cell (its workers never load ``torch.distributed.tensor``). A failure here never fails the cell:
        the mirrors are then marked stale (a restart refuses in one line until the next refresh)."""
        if stepped or (trained and self.sharded):
            self.refresh_safely(core)

    def refresh_safely(self, core: "GroupCore") -> None:
        """:meth:`refresh`, logging instead of raising (what called it succeeded; the mirrors go stale)."""
        try:
            self.refresh(core)
        except Exception as exc:  # noqa: BLE001 - the cell or snapshot itself succeeded
            logger.warning("the mirrors of the shards could not be refreshed (%s): a lost rank now needs a snapshot",
                           str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
            self.holders, self.world = {}, 0

    def turn(self, core: "GroupCore", on: bool) -> Optional[str]:
        """Switch mirroring on (and mirror now) or off (and drop every mirror); returns :meth:`summary`."""
        self.enabled = bool(on)
        if on:
            self.refresh(core)
            return self.summary()
        core.collect([s.actor.mirror_forget.remote() for s in core.slots if not s.gone], timing.CONTROL_CALL_S,
                     "drop the mirrors of shards in")
        self.holders, self.world = {}, 0
        return self.summary()

    def unmirrored(self, core: "GroupCore") -> Tuple[Tuple[int, ...], str]:
        """The ranks (at the last refresh) whose mirror is kept by a worker that is gone, and why, for the plan."""
        if not self.sharded:
            return (), ""
        if not self.enabled or not self.holders:
            return tuple(core.slots.gone_ranks()), "mirrors of shards are off (group.mirror_shards(False))"
        alive = {id(s.actor) for s in core.slots if not s.gone}
        lost = tuple(r for r, actor in sorted(self.holders.items()) if id(actor) not in alive)
        return lost, "their buddy, which kept their mirror, is gone too"

    def gather(self, core: "GroupCore") -> List[Any]:
        """Object refs to every rank's mirror (at the last refresh), before any worker is touched; a live rank whose
        mirror went with its buddy gives a fresh one, if it has not trained since.

        Raises:
            GroupError: a rank's shards are gone (one line, offering ``--from-checkpoint``).
        """
        slots = list(core.slots)
        live = {id(s.actor) for s in slots if not s.gone}
        kept = {r for r in range(self.world) if id(self.holders.get(r)) in live}
        retake = [r for r in range(self.world) if r not in kept and r < len(slots) and not slots[r].gone]
        gone = [r for r in range(self.world) if r not in kept and r not in retake]
        if gone:
            raise GroupError(LOST_SHARDS.format(ranks=", ".join(map(str, gone)),
                                         why="their buddy, which kept their mirror, is gone too"))
        clean = core.collect([slots[r].actor.mirror_is_clean.remote() for r in retake], timing.CONTROL_CALL_S,
                             "say whether they trained since their mirror in")
        dirty = [r for r, ok in zip(retake, clean) if not ok]
        if dirty:
            raise GroupError(LOST_SHARDS.format(ranks=", ".join(map(str, dirty)), why=(
                "their buddy, which kept their mirror, is gone, and they trained since, so their shards no longer "
                "match the others' mirror point")))
        # refs only: each rank fetches them when it re-shards; the driver never holds the shards. They are in the
        # object store before any worker (a holder among them) is retired.
        refs = [self.holders[r].mirror_get.remote(r) if r in kept else slots[r].actor.mirror_take.remote()
                for r in range(self.world)]
        _, late = wait_within(refs, timing.SNAPSHOT_WRITE_S, "every rank's mirror of its shards to be handed over",
                              log=logger)
        if late:
            raise GroupError(f"{len(late)} mirror(s) of shards were not handed over within "
                             f"{timing.SNAPSHOT_WRITE_S:g} s: %dist_status shows which ranks do not answer")
        return refs

    def share_text(self, rank: int) -> str:
        """What rank ``rank`` holds of a sharded group (for ``%dist_status`` and the dashboard), or ""."""
        if not self.sharded or rank >= len(self.shares):
            return ""
        return f"fsdp2 1/{self.world}: {self.shares[rank] / 2**20:.1f} MiB"

    def summary(self) -> Optional[str]:
        """One line: what the mirrors cost at the last refresh, or None when nothing is sharded."""
        if not self.sharded:
            return None
        state = "on" if self.enabled else "off"
        return f"mirrors of shards {state}: {self.last_bytes / 2**20:.1f} MiB kept by buddies, {self.last_s:.2f} s"
