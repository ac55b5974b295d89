"""Carrying out a recovery plan (``plans.py``): one executor for restart, rescale and replacing stuck ranks.

Each step of the plan is one method here. Steps that touch nothing (handing state over before fresh
processes, reserving more places) run first, with the group as it was; the first step that touches a
worker turns the group ``RECOVERING``. When a step fails the executor undoes what the plan's shape allows
(``undo.py``): an in-place replacement drops its new workers (the survivors keep their state); a resize whose new
ranks could not get their state re-forms the kept workers as they were; a sharded group's resize re-forms its live
kept workers and shards their models again from the gathered mirrors; fresh processes that did not come up all go,
the handed-over state kept for the next restart.

A new worker rebuilds its namespace in two steps. It replays the group's setup cells, and the imports,
functions and classes of every other cell, with collectives deferred (``prepare_model`` returns a DDP
object bound later). Then every rank joins a new process group, and a live peer sends the new rank every
object replaying did not give it (see the worker's ``replicate`` and ``transfer`` modules), or, where no
process group carries it, the driver copies it (``peer_state.py``).
"""
from __future__ import annotations

import dataclasses
import logging
import re
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Set, Tuple

from ..errors import GroupError, RecoveryError
from .peer_state import copy_to_fresh
from .placement import await_bundles, bundles_placed, check_cluster, reserve, share_cpus
from .plans import (AwaitPlaces, Carry, CopyFromPeer, GatherMirrors, Join, LoadCarried, Rebind, RecoveryPlan, Replay,
                    Reserve, Reshard, Retire, Spawn)
from .rank_refresh import refresh_rank_values
from .retiring import kill_worker, retire
from .undo import back_to, drop_unjoined, renewal_failed, settle_sharded
from .slots import Place, Slot
from .state import GroupState, SlotState
from .timing import CONTROL_CALL_S, CONTROL_START_S

if TYPE_CHECKING:  # the core and its formation are handed in; never imported here at run time
    from .core import GroupCore
    from .formation import Formation

logger = logging.getLogger(__name__)

#: Steps that touch no worker: they run before the group turns RECOVERING, and a failure leaves it as it was.
_BEFORE = (Carry, Reserve, GatherMirrors)


@dataclasses.dataclass(frozen=True)
class RecoveryTimings:
    """Where the seconds of the latest recovery went (``WorkerGroup.last_recovery``).

    Attributes:
        operation: ``restart``, ``rescale`` or ``replace``.
        steps: ``(step, seconds)`` in the order the plan ran them (``Retire``, ``Spawn``, ``Replay``, ``Join``...).
        import_s: of the ``Replay`` step, the longest a new worker spent importing what it starts with (torch),
            from its own clock (0 when no worker was new).
    """

    operation: str
    steps: Tuple[Tuple[str, float], ...]
    import_s: float = 0.0

    @property
    def total_s(self) -> float:
        return sum(seconds for _, seconds in self.steps)

    def seconds(self, step: str) -> float:
        """The seconds of ``step`` (by its name; summed if it ran twice), 0 if it did not run."""
        return sum(seconds for name, seconds in self.steps if name == step)

    def __str__(self) -> str:
        parts = [f"{name} {seconds:.2f} s" + (f" (importing {self.import_s:.2f} s)" if name == "Replay" and
                                                self.import_s else "") for name, seconds in self.steps]
        return f"{self.operation} {self.total_s:.2f} s: {', '.join(parts)}"


class Execution:
    """One plan being carried out on a group's ``core`` (new workers started and joined by its ``formation``);
    :attr:`timings` holds each step's seconds, in order."""

    def __init__(self, core: "GroupCore", formation: "Formation", plan: RecoveryPlan,
                 from_checkpoint: bool = False) -> None:
        self.core, self.formation, self.plan, self.from_checkpoint = core, formation, plan, from_checkpoint
        slots = core.slots
        self.keep: List[Slot] = [slots[r] for r in plan.keep]
        self.new: List[Slot] = []
        self.extra: Optional[Any] = None  # (placement group, size) reserved for this plan
        self.replays: Dict[int, List[str]] = {}
        self.results: List[Any] = []
        self.unjoined: Set[int] = set()
        self.timings: List[tuple] = []
        self.import_s = 0.0
        self.spared: Set[int] = set()  # ranks a standby worker took
        self.mirrors: List[Any] = []  # refs to every old rank's mirror of its shards (a sharded group)
        self.resharded = False  # a sharded group's models are sharded over the new process group
        self.epoch = 0  # this recovery's number, which its early leaves and its join carry (0: the join's own)
        self.leaving: List[Any] = []  # the kept ranks' early leaves of their old process group

    def run(self) -> None:
        """Every step in order, then the group is ``IDLE``; on a failure, undo (see the module) and raise."""
        if not self.plan.in_place:  # new workers take the share of the new size; fail fast on what cannot fit
            self._size_config()
        recovering = False
        try:
            for step in self.plan.steps:
                if not recovering and not isinstance(step, _BEFORE):
                    self.core.transition(GroupState.RECOVERING)
                    recovering = True
                started = time.perf_counter()
                getattr(self, f"do_{type(step).__name__.lower()}")(step)
                self.timings.append((step, time.perf_counter() - started))
            self._say_replay_failures()
        except BaseException as exc:
            if recovering:
                self._undo(exc)
            raise
        if self.plan.operation == "rescale" or not self.plan.in_place:
            self.core.config = dataclasses.replace(self.core.config, num_workers=self.plan.num_workers)
        self.core.last_recovery = RecoveryTimings(
            self.plan.operation, tuple((type(step).__name__, t) for step, t in self.timings), self.import_s)
        self.core.transition(GroupState.IDLE)
        logger.info("%s", self.core.last_recovery)

    # -- the steps -------------------------------------------------------------------------------------

    def do_carry(self, step: Carry) -> None:
        core = self.core
        data = core.collect([core.slots[step.src].actor.carry_state.remote()], core.settings.start_timeout_s,
                            f"rank {step.src} to hand over its state before fresh processes replace")[0]
        core.carried = (step.src, data)

    def do_reserve(self, step: Reserve) -> None:
        core = self.core
        pg = reserve(dataclasses.replace(core.config, num_workers=step.count), step.count,
                     core.settings.placement_timeout_s, core.settings.keep_alive_s > 0)
        core.slots.pgs.append(pg)
        self.extra = (pg, step.count)

    def do_retire(self, step: Retire) -> None:
        slots = [self.core.slots[r] for r in step.ranks]
        if step.await_deaths:
            retire(slots)
        else:
            for slot in slots:
                kill_worker(slot)
        if not self.plan.in_place:  # their places are free for the new workers, or for a later growth
            self.core.slots.free.extend(slot.place for slot in slots)

    def do_awaitplaces(self, step: AwaitPlaces) -> None:
        core = self.core
        if not await_bundles([core.slots[r].place for r in step.ranks], core.settings.placement_timeout_s):
            names = ", ".join(str(r) for r in step.ranks)
            raise GroupError(f"the place of rank(s) {names} is gone (its node left the cluster) and no node took it "
                             f"within {core.settings.placement_timeout_s:g} s: continue with fewer workers "
                             "(%dist_rescale N, group.rescale(n)), or add a node and restart again")

    def do_spawn(self, step: Spawn) -> None:
        self._leave_early()
        slots = self.core.slots
        if self.plan.in_place:
            for r in step.ranks:
                spare = slots.take_spare()  # a standby worker, started and with torch imported
                old = slots.put(r, spare if spare is not None else self.formation.spawn(*slots[r].place))
                if spare is not None:
                    self.spared.add(r)
                    slots.spares.append(self.formation.spawn(*old.place))  # refill in the background
                    slots.spares[-1].actor.warm.remote()
            self.new = [slots[r] for r in step.ranks]
        else:
            self.new = [self.formation.spawn(pg, bundle) for pg, bundle in self._places(len(step.ranks))]
            slots.assign(self.keep + self.new)
        self.formation.describe(self.new)

    def do_replay(self, step: Replay) -> None:
        self.replays, imports = prepare_new(self.core, self.formation, step.ranks)
        # a spare imported long before this recovery: only new processes' imports are part of it
        self.import_s = max((t for r, t in imports.items() if r not in self.spared), default=0.0)

    def do_join(self, step: Join) -> None:
        core = self.core
        if not self.plan.in_place and not self.new:  # a shrink: the kept workers are the group
            core.slots.assign(self.keep)
        self.unjoined = {r for r, s in enumerate(core.slots) if not s.joined}
        peer = step.src is not None
        self._left()
        self.results = self.formation.rendezvous("join", src=step.src if peer else 0,
                                                 fresh=step.ranks if peer else (), anew=not peer, epoch=self.epoch)

    def do_copyfrompeer(self, step: CopyFromPeer) -> None:
        fresh = sorted(set(step.ranks) | self.unjoined)  # a worker that never completed a formation is new too
        held = [r for r in range(self.core.num_workers) if r not in fresh]
        if not held:
            raise GroupError("no worker holds the group's state (every one is new): shut the group down and "
                             "start a new one, then roll back to a checkpoint")
        src = step.src if step.src not in fresh else held[0]
        copy_to_fresh(self.core, src, fresh, self.results)
        self.formation.note_missing(self.results)

    def do_gathermirrors(self, step: GatherMirrors) -> None:
        self.mirrors = self.core.mirrors.gather(self.core)

    def do_reshard(self, step: Reshard) -> None:
        core = self.core
        mirrors = self.mirrors if step.from_mirrors else []
        core.collect([s.actor.reshard.remote(mirrors) for s in core.slots], core.settings.start_timeout_s,
                     "shard their sharded models again from the mirrors in", collective=True)
        self.mirrors, self.resharded = [], True
        core.mirrors.refresh(core)  # every rank's mirror to its new buddy

    def do_rebind(self, step: Rebind) -> None:
        refresh_rank_values(self.core)  # rank, world_size...: right on every rank, survivors too

    def do_loadcarried(self, step: LoadCarried) -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        core = self.core
        if core.carried is None:
            raise GroupError("no live worker is left to copy the state from: restart from a checkpoint "
                             "(%dist_restart --from-checkpoint NAME, group.restart(from_checkpoint=...)), or start "
                             "a new group and roll back to one")
        src, data = core.carried
        ref = ray.put(data)
        results = core.collect([s.actor.load_carried.remote(ref) for s in core.slots],
                               core.settings.start_timeout_s, "load the state carried from the old processes into")
        missing = results[0]["missing"]
        if missing:
            line = (f"{', '.join(missing)}: made in cells that are not replayed, so the fresh processes lack them "
                    f"and rank {src}'s state for them is gone; mark their cell --setup, or run it again")
            logger.warning("%s", line)
            core.replay_failures.append(line)
        core.carried = None

    # -- helpers ---------------------------------------------------------------------------------------

    def _leave_early(self) -> None:
        """The kept ranks leave their old process group now, while the new workers start and replay (seconds):
        at 16 ranks on 2 cores leaving took 50-90 ms of the join. Not in a sharded group (its models re-shard from
        the old mesh), nor where no torch process group is formed."""
        if not self.core.kind.process_group or any(isinstance(s, (GatherMirrors, Reshard)) for s in self.plan.steps):
            return
        self.epoch = self.formation.new_epoch()
        self.leaving = [slot.actor.leave_group.remote(self.epoch) for slot in self.keep]

    def _left(self) -> None:
        """The early leaves' answers (long there: the new workers started and replayed meanwhile). One that failed
        or did not come is the join's to find and name, with that rank's trouble."""
        if not self.leaving:
            return
        try:
            self.core.collect(self.leaving, CONTROL_CALL_S, "leave the old process group of")
        except Exception as exc:  # noqa: BLE001 - the join reports the rank
            logger.debug("leaving the old process group early: %s", exc)
        self.leaving = []

    def _size_config(self) -> None:
        core, n = self.core, self.plan.num_workers
        asked = dataclasses.replace(core.config, num_workers=n, cpus_per_worker=core.settings.cpus_asked)
        shared = share_cpus(asked, n)
        core.config = dataclasses.replace(core.config, cpus_per_worker=shared.cpus_per_worker)
        check_cluster(dataclasses.replace(core.config, num_workers=n), n)

    def _places(self, need: int) -> List[Place]:
        """Places for ``need`` new workers: free ones still on live nodes first, then the plan's reserve, then
        new ones where the cluster has room (for places lost with their node)."""
        core, slots = self.core, self.core.slots
        places = [p for p, ok in zip(slots.free, bundles_placed(slots.free)) if ok][:need]
        for place in places:
            slots.free.remove(place)
        if self.extra is not None:
            pg, size = self.extra
            places += [(pg, i) for i in range(min(need - len(places), size))]
        if len(places) < need:
            more = need - len(places)
            pg = reserve(dataclasses.replace(core.config, num_workers=more), more, core.settings.placement_timeout_s,
                         core.settings.keep_alive_s > 0)
            slots.pgs.append(pg)
            places += [(pg, i) for i in range(more)]
        return places

    def _say_replay_failures(self) -> None:
        """The replay failures that joining did not explain (a NameError for a name the rank then received from
        its peer is not one)."""
        for r, lines in self.replays.items():
            res = self.results[r] if r < len(self.results) else None
            received = set(res.get("received", ())) if isinstance(res, dict) else set()
            for line in lines:
                name = re.search(r"NameError: name '(\w+)' is not defined", line)
                if name and name.group(1) in received:
                    logger.debug("rank %d: replaying %s (received on joining)", r, line)
                    continue
                logger.warning("rank %d: replaying %s", r, line)
                self.core.replay_failures.append(f"rank {r}: {line}")

    def _undo(self, exc: BaseException) -> None:
        core = self.core
        if self.plan.in_place:  # the new workers go; the survivors keep their state (and can rescale to fewer)
            for r in self.plan.new_ranks:
                kill_worker(core.slots[r])
                core.slots[r].mark(SlotState.DEAD, "its replacement failed to start")
            core.transition(GroupState.FAILED)
        elif core.kind.fresh_processes:
            renewal_failed(core)
        elif any(isinstance(step, Reshard) for step in self.plan.steps) and not self.resharded:
            settle_sharded(core, self.formation, self.plan.operation, self.keep, self.new, self.mirrors, exc)
        elif isinstance(exc, RecoveryError):
            back_to(core, self.formation, self.keep, self.new)
        else:
            drop_unjoined(core)
            core.transition(GroupState.FAILED)


def carry_out(core: "GroupCore", formation: "Formation", plan: RecoveryPlan,
              from_checkpoint: bool = False) -> Execution:
    """Run ``plan`` on the group of ``core`` (see :class:`Execution`); returns the execution, with each step's
    time."""
    execution = Execution(core, formation, plan, from_checkpoint)
    execution.run()
    return execution


def prepare_new(core: "GroupCore", formation: "Formation",
                ranks: Sequence[int]) -> Tuple[Dict[int, List[str]], Dict[int, float]]:
    """Set up the workers of ``ranks`` without joining, then replay the cells on them.

    Returns each rank's replay failures (one line each), to be judged once the rank joined (a cell that
    used an object the rank receives from a peer on joining failed only for want of it), and how long each
    spent importing what it starts with (torch), by its own clock."""
    # The run directory first: report(checkpoint=...) and get_checkpoint() work on a new rank too.
    slots = core.slots
    validates = core.run_storage.validator is not None  # report(validation=...) allowed
    core.collect([slots[r].actor.set_storage.remote(core.run_storage.url, validates) for r in ranks], CONTROL_START_S,
                 "start")
    infos = formation.contexts()
    addr = slots[0].info.get("node_ip", "127.0.0.1")
    refs = [slots[r].actor.setup.remote(infos[r].context(core.name), infos[r].env(addr, 0),
                                        core.backend, addr, 0, True) for r in ranks]
    imports: Dict[int, float] = {}
    for r, res in zip(ranks, core.collect(refs, core.settings.start_timeout_s, "start")):
        slots[r].device = res["device"]
        imports[r] = res.get("preload_s", 0.0)
    if core.pushed:  # values pushed from the notebook, which the cells to replay may use
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        ref = ray.put(dict(core.pushed))
        core.collect([slots[r].actor.push.remote(ref) for r in ranks], CONTROL_START_S, "receive pushed values in")
    cells = [(c.cell_id, c.source, c.setup) for c in core.history]
    if not cells:
        return {}, imports
    if core.kind.fresh_processes:  # every rank replays together, inside the backend (TensorFlow's strategy spans them)
        with core.driver_cell(list(ranks)) as specs:
            failed = core.collect([slots[r].actor.replay.remote(cells, spec) for r, spec in zip(ranks, specs)],
                                  core.settings.start_timeout_s, "replay the cells of")
    else:
        failed = core.collect([slots[r].actor.replay.remote(cells) for r in ranks], core.settings.start_timeout_s,
                              "replay the cells of")
    return dict(zip(ranks, failed)), imports
