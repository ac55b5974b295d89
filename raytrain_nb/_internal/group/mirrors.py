"""Buddy mirrors: every rank's newest copy of its shards kept in a peer's memory, so no shard is lost with a rank.

Under full sharding (FSDP2) a rank's shards exist nowhere else. At the end of each whole-group cell that trained
and on every snapshot, each rank ``r`` takes a mirror of its shards and rank ``(r + 1) % N`` (its buddy) keeps it;
the mirror goes from rank to buddy through Ray's object store, never through the driver's memory. A restart or
rescale of a sharded group first gathers every old rank's mirror (:meth:`Mirrors.gather`, before any worker is
touched), then, once the process group re-formed, every rank re-shards from them (the plan's ``Reshard`` step).

Cost: each rank holds its buddy's shards besides its own (about twice the memory of its share of parameters and
optimizer state), and each training cell ends with one copy of every rank's shards. ``WorkerGroup.mirror_shards(
False)`` turns it off; then a lost rank of a sharded group is restored only from a snapshot.

``mirror_shards(True, every=K)`` mirrors inside a long cell too: every K-th ``report()`` each rank takes a mirror on
its training thread (one take per K reports, the step's pause) and names it in its poll; the driver has its buddy
stage it on the control threads (:meth:`Mirrors.stage`) and switches to that *point* only once every rank's mirror
of it is kept, so a rank dying between its take and its buddy's keep leaves the previous complete point in use. A
restart after a kill mid-cell then restores the state of the last complete point rather than the cell's start.
Meanwhile a buddy holds a rank's point in use and the ones being staged (usually one), and each rank its own takes
from the point in use on in the object store (a restart whose buddy died takes that rank's own copy of the point).
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



#: The start of the one-line refusal of every cell while a failed recovery left the sharded models off the group's
#: process group (:attr:`Mirrors.unsettled` says why and what to do).
UNSETTLED = "the sharded models are not sharded over the group's process group"

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
                        timing.SNAPSHOT_WRITE_S, f"gather the sharded {name!r} of", collective=True)
    value = full[0 if rank is None else rank]
    return [value] * len(full) if rank is None else value


class Mirrors:
    """Which worker keeps each rank's newest mirror, and what the last refresh cost."""

    def __init__(self) -> None:
        self.enabled = True
        self.sharded = False  # the group holds a sharded model (known from the last refresh)
        self.holders: Dict[int, Any] = {}  # rank (at the last refresh) -> the actor keeping its mirror
        self.owners: Dict[int, Any] = {}  # rank (at the last refresh) -> its own actor then
        #: (point, refs) of the last gather, until the next refresh: what a recovery that failed midway leaves
        self.gathered: Optional[Tuple[Tuple[int, int], List[Any]]] = None
        #: why the ranks' sharded models may not be on the group's process group (a recovery failed after
        #: re-forming it and could not re-shard them); "" when they are
        self.unsettled = ""
        self.world = 0
        self.last_bytes = 0
        self.last_s = 0.0
        self.shares: List[int] = []  # each rank's bytes of shards (parameters and optimizer state) at the refresh
        self.every = 0  # also mirror every this many reports inside a cell (0: only between cells)
        self.epoch = 0  # counts the refreshes: a point is (epoch, takes inside cells since)
        self.point: Tuple[int, int] = (0, 0)  # the newest point every rank's buddy keeps (what a restart uses)
        self.point_report = 0  # the report of the running (or last) cell the point was taken at (0: between cells)
        self._staging: Dict[Tuple[int, int], Dict[int, Any]] = {}  # point -> rank -> its buddy's stage call
        self._reports: Dict[Tuple[int, int], int] = {}  # point -> the report it was taken at
        self.restored_report = 0  # the report of the cell the last restart or rescale took the shards at (0: end)

    def refresh(self, core: "GroupCore") -> None:
        """Every rank's mirror to its buddy now (a no-op where nothing is sharded or the switch is off)."""
        if not self.enabled:
            return
        slots = list(core.slots)
        n = len(slots)
        started = time.perf_counter()
        self.epoch += 1
        point, self._staging, self._reports = (self.epoch, 0), {}, {}
        takes = [s.actor.mirror_take.remote(point=point, every=self.every) for s in slots]
        keeps = [slots[(r + 1) % n].actor.mirror_keep.remote(r, takes[r], point) for r in range(n)]
        sizes = core.collect(keeps, timing.SNAPSHOT_WRITE_S, "keep each rank's mirror of its shards on its buddy in")
        self.point, self.point_report = point, 0
        self.sharded = any(sizes)
        self.holders = {r: slots[(r + 1) % n].actor for r in range(n)} if self.sharded else {}
        self.owners = {r: slots[r].actor for r in range(n)} if self.sharded else {}
        self.gathered, self.unsettled = None, ""  # every rank's shards are mirrored as they are now
        self.world = n if self.sharded else 0
        self.last_bytes, self.last_s = sum(sizes), time.perf_counter() - started
        self.shares = list(sizes) if self.sharded else []
        if self.sharded:
            logger.debug("mirrored %d bytes of shards in %.3f s", self.last_bytes, self.last_s)

    def staged(self, core: "GroupCore", polls: Dict[int, Dict[str, Any]]) -> None:
        """:meth:`stage` where a poll names a mid-cell mirror or one is being staged (else nothing to do)."""
        if self._staging or any("mirrors" in polled for polled in polls.values()):
            self.stage(core, polls)

    def stage(self, core: "GroupCore", polls: Dict[int, Dict[str, Any]]) -> None:
        """A poll round's mid-cell mirrors (``every=K``): each to its rank's buddy (refs only, on the buddy's control
        threads), then the newest point every rank's buddy has kept becomes the point a restart uses."""
        import ray  # ray: loaded when a group runs, not on import raytrain_nb

        slots = list(core.slots)
        n = len(slots)
        for rank, polled in polls.items():
            for taken in polled.get("mirrors", ()):
                point = tuple(taken["point"])
                if not self.sharded or n != self.world or point[0] != self.epoch or point <= self.point:
                    continue  # from before the last refresh, or older than the point in use
                buddy = slots[(rank + 1) % n].actor
                self._staging.setdefault(point, {})[rank] = buddy.mirror_stage.remote(rank, point, taken["ref"],
                                                                                       self.point)
                self._reports[point] = taken["report"]
        for point in sorted(self._staging, reverse=True):
            calls = self._staging[point]
            if len(calls) < n:
                continue
            ready, _ = ray.wait(list(calls.values()), num_returns=n, timeout=0)
            if len(ready) < n:
                continue
            try:
                sizes = ray.get([calls[r] for r in range(n)], timeout=timing.CONTROL_CALL_S)
            except Exception as exc:  # noqa: BLE001 - a buddy died: this point is never complete
                logger.debug("mid-cell mirror point %s dropped: %s", point, exc)
                del self._staging[point]
                continue
            if min(sizes) >= 0:  # -1: a buddy ignored it (a newer point in use there)
                self.point, self.point_report = point, self._reports.get(point, 0)
                self.shares, self.last_bytes = list(sizes), sum(sizes)
                for slot in slots:  # each rank drops its own older takes (fire and forget: nothing waits)
                    if not slot.gone:
                        slot.actor.mirror_committed.remote(point)
                logger.debug("mirror point %s (report %d) kept by every buddy", point, self.point_report)
                break
            del self._staging[point]
            self._reports.pop(point, None)
        for point in [p for p in self._staging if p <= self.point]:
            del self._staging[point]
            self._reports.pop(point, None)

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

    def turn(self, core: "GroupCore", on: bool, every: int = 0) -> Optional[str]:
        """Switch mirroring on (and mirror now; ``every``: inside cells too, every that many reports) or off (and
        drop every mirror); returns :meth:`summary`."""
        if every < 0 or int(every) != every:
            raise GroupError(f"every={every!r}: give a whole number of reports (0: mirror between cells only)")
        self.enabled, self.every = bool(on), int(every) if on else 0
        if on:
            self.refresh(core)
            return self.summary()
        core.collect([s.actor.mirror_forget.remote() for s in core.slots if not s.gone], timing.CONTROL_CALL_S,
                     "drop the mirrors of shards in")
        self.holders, self.world, self.gathered = {}, 0, None
        return self.summary()

    def unmirrored(self, core: "GroupCore") -> Tuple[Tuple[int, ...], str]:
        """The ranks (at the last refresh) whose mirror is kept by a worker that is gone, and why, for the plan."""
        if not self.sharded or (self.gathered is not None and self.gathered[0] == self.point):
            return (), ""  # (a failed recovery's gather holds every rank's mirror)
        if not self.enabled or not self.holders:
            return tuple(core.slots.gone_ranks()), "mirrors of shards are off (group.mirror_shards(False))"
        alive = {id(s.actor) for s in core.slots if not s.gone}
        lost = tuple(r for r, actor in sorted(self.holders.items()) if id(actor) not in alive)
        return lost, "their buddy, which kept their mirror, is gone too"

    def gather(self, core: "GroupCore") -> List[Any]:
        """Object refs to every rank's mirror (at the last refresh), before any worker is touched; a live rank whose
        mirror went with its buddy gives its own copy of the point, or a fresh one if it has not trained since.

        Every mirror is handed over as the result of a call the driver owns, and the call is confirmed done (a
        small second result), so a buddy dying meanwhile is seen here, not when the ranks re-shard. The refs stay
        held until the mirrors are refreshed: a recovery that failed after touching the workers leaves them for
        the next one (the buddies it retired, or a half re-sharded rank, no longer hold the point).

        Raises:
            GroupError: a rank's shards are gone (one line, offering ``--from-checkpoint``).
        """
        if self._staging:
            self.stage(core, {})  # a point whose every mirror was kept after the last poll
        if self.gathered is not None and self.gathered[0] == self.point:
            return list(self.gathered[1])
        held = self._alive(core, self.holders)
        refs = self._handed({r: self.holders[r].mirror_hand.options(num_returns=2).remote(r, self.point)
                             for r in range(self.world) if r in held})
        owners = self._alive(core, self.owners)
        retake = [r for r in range(self.world) if r not in refs and r in owners]
        gone = [r for r in range(self.world) if r not in refs and r not in owners]
        if gone:
            raise GroupError(LOST_SHARDS.format(ranks=", ".join(map(str, gone)),
                                                why="their buddy, which kept their mirror, is gone too"))
        if retake:  # their own copy of a mid-cell point (control threads), else a fresh take if they did not train
            refs.update(self._handed({r: self.owners[r].mirror_own_hand.options(num_returns=2).remote(self.point)
                                      for r in retake}))
            retake = [r for r in retake if r not in refs]
            clean = core.collect([self.owners[r].mirror_is_clean.remote(self.point) for r in retake],
                                 timing.CONTROL_CALL_S, "say whether they trained since their mirror in")
            dirty = [r for r, ok in zip(retake, clean) if not ok]
            if dirty:
                raise GroupError(LOST_SHARDS.format(ranks=", ".join(map(str, dirty)), why=(
                    "their buddy, which kept their mirror, is gone, and they trained since, so their shards no "
                    "longer match the others' mirror point")))
            refs.update(self._handed({r: self.owners[r].mirror_hand_take.options(num_returns=2).remote()
                                      for r in retake}))
        lost = [r for r in range(self.world) if r not in refs]
        if lost:
            raise GroupError(LOST_SHARDS.format(ranks=", ".join(map(str, lost)), why=(
                "the worker handing over their mirror died or did not answer meanwhile")))
        self.restored_report = self.point_report
        if self.point_report:
            logger.info("the shards come back as they were at report %d of the last cell (its last mirror point)",
                        self.point_report)
        # refs only: each rank fetches them when it re-shards; the driver never holds the shards. They are in the
        # object store, owned by the driver, before any worker (a holder among them) is retired.
        ordered = [refs[r] for r in range(self.world)]
        self.gathered = (self.point, ordered)
        return list(ordered)

    @staticmethod
    def _alive(core: "GroupCore", actors: Dict[int, Any]) -> Dict[int, Any]:
        """Of ``actors`` (rank -> actor), those whose worker is still one of the group's live workers."""
        live = {id(s.actor) for s in core.slots if not s.gone}
        return {r: a for r, a in actors.items() if id(a) in live}

    @staticmethod
    def _handed(calls: Dict[int, Tuple[Any, Any]]) -> Dict[int, Any]:
        """rank -> the ref of its mirror, for the hand-overs (``(mirror ref, done ref)`` each) that are done and
        held a mirror; one whose worker died, raised or did not answer in time is left out (logged)."""
        import ray  # ray: loaded when a group runs, not on import raytrain_nb

        if not calls:
            return {}
        dones = [done for _, done in calls.values()]
        ready, _ = wait_within(dones, timing.SNAPSHOT_WRITE_S, "every rank's mirror of its shards to be handed over",
                               log=logger)
        out: Dict[int, Any] = {}
        for r, (mirror, done) in calls.items():
            if done not in ready:
                logger.warning("the mirror of rank %d was not handed over within %g s", r, timing.SNAPSHOT_WRITE_S)
                continue
            try:
                if ray.get(done, timeout=timing.CONTROL_CALL_S):
                    out[r] = mirror
            except Exception as exc:  # noqa: BLE001 - the worker handing it over died or raised: another way
                logger.warning("the mirror of rank %d could not be handed over: %s", r,
                               str(exc).splitlines()[0] if str(exc) else type(exc).__name__)
        return out

    def share_text(self, rank: int) -> str:
        """What rank ``rank`` holds of a sharded group (for ``%dist_status`` and the dashboard), or ""."""
        if not self.sharded or rank >= len(self.shares):
            return ""
        return f"fsdp2 1/{self.world}: {self.shares[rank] / 2**20:.1f} MiB"

    def summary(self) -> Optional[str]:
        """One line: what the mirrors cost at the last refresh, or None when nothing is sharded."""
        if not self.sharded:
            return None
        state = ("on" if self.enabled else "off") + (f", every {self.every} reports too" if self.every else "")
        return f"mirrors of shards {state}: {self.last_bytes / 2**20:.1f} MiB kept by buddies, {self.last_s:.2f} s"
