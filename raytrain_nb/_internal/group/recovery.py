"""Replacing dead workers and resizing a live group, keeping the warm state.

A new worker rebuilds its namespace in two steps. It replays the group's setup cells, and the
imports, functions and classes of every other cell, with collectives deferred (``prepare_model``
returns a DDP object bound later). Then every rank joins a new process group, and a live peer
sends the new rank every object replaying did not give it (a model built in a cell that also
trained it, rebuilt later, held in a dict or an attribute...) and brings the replicated state in
line (see the worker's ``replicate`` and ``transfer`` modules). When a new rank cannot get an
object, the new workers go and the survivors stay as they were.
"""
from __future__ import annotations

import dataclasses
import logging
import re
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence

from ..errors import GroupError, RecoveryError
from ..worker import framework as frameworks
from .placement import await_bundles, await_recorded_deaths, bundles_placed, check_cluster, reserve, share_cpus
from .slots import Place, Slot
from .state import GroupState, SlotState
from .timing import CONTROL_START_S

if TYPE_CHECKING:  # the group calls in here; this module never imports it at run time
    from .group import WorkerGroup

logger = logging.getLogger(__name__)

ON_FAILURE = ("raise", "restart", "rescale")


def _kill(slot: Slot) -> None:
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    try:
        ray.kill(slot.actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


def retire(slots: Sequence[Slot]) -> None:
    """Kill the workers of ``slots`` so their places can take new ones.

    The dead ones are first left to Ray to record as dead: a process that died on a live node is
    recorded at once, one on a lost node only when Ray declares the node dead, and until then the
    node's placement-group bundles still look usable (a worker started there dies at once). Killing
    them ourselves would have Ray record them dead at once and hide that.
    """
    await_recorded_deaths([s.actor for s in slots if s.state == SlotState.DEAD])
    for slot in slots:
        _kill(slot)


def _prepare_new(group: "WorkerGroup", ranks: Sequence[int]) -> Dict[int, List[str]]:
    """Set up the workers of ``ranks`` without joining, then replay the cells on them.

    Returns each rank's replay failures (one line each), to be judged once the rank joined (a cell that
    used an object the rank receives from a peer on joining failed only for want of it)."""
    # The run directory first: report(checkpoint=...) and get_checkpoint() work on a new rank too.
    slots = group.slots
    group._get([slots[r].actor.set_storage.remote(group.run_storage.url) for r in ranks], CONTROL_START_S, "start")
    infos = group._contexts()
    addr = slots[0].info.get("node_ip", "127.0.0.1")
    refs = [slots[r].actor.setup.remote(infos[r].context(group.name), infos[r].env(addr, 0),
                                        group.backend, addr, 0, True) for r in ranks]
    for r, res in zip(ranks, group._get(refs, group.start_timeout_s, "start")):
        slots[r].device = res["device"]
    if group.pushed:  # values pushed from the notebook, which the cells to replay may use
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        ref = ray.put(dict(group.pushed))
        group._get([slots[r].actor.push.remote(ref) for r in ranks], CONTROL_START_S, "receive pushed values in")
    cells = [(c.cell_id, c.source, c.setup) for c in group.history]
    if not cells:
        return {}
    if _fresh(group):  # every rank replays together, inside the backend (TensorFlow's strategy spans them)
        with group._framework_cell(list(ranks)) as specs:
            failed = group._get([slots[r].actor.replay.remote(cells, spec) for r, spec in zip(ranks, specs)],
                                group.start_timeout_s, "replay the cells of")
    else:
        failed = group._get([slots[r].actor.replay.remote(cells) for r in ranks], group.start_timeout_s,
                            "replay the cells of")
    return dict(zip(ranks, failed))


def _join_new(group: "WorkerGroup", src: Optional[int], ranks: Sequence[int], failed: Dict[int, List[str]]) -> None:
    """Re-form the group with the new ``ranks``; then report the replay failures that joining did not
    explain (a NameError for a name the rank then received from its peer is not one). ``src`` None: every
    rank is new and nothing is copied (a checkpoint is loaded next)."""
    results = group._rendezvous("join", src=src if src is not None else 0, fresh=ranks if src is not None else (),
                                anew=src is None)
    for r, lines in failed.items():
        received = set(results[r].get("received", ())) if isinstance(results[r], dict) else set()
        for line in lines:
            name = re.search(r"NameError: name '(\w+)' is not defined", line)
            if name and name.group(1) in received:
                logger.debug("rank %d: replaying %s (received on joining)", r, line)
                continue
            logger.warning("rank %d: replaying %s", r, line)
            group.replay_failures.append(f"rank {r}: {line}")


def _survivor(group: "WorkerGroup", new: Sequence[int], from_checkpoint: bool = False) -> Optional[int]:
    """The rank new ones copy their state from; None when every rank is new and a checkpoint follows."""
    live = [r for r in range(group.num_workers) if r not in new]
    if not live and not from_checkpoint:
        raise GroupError("no live worker is left to copy the state from: restart from a checkpoint "
                         "(%dist_restart --from-checkpoint NAME, group.restart(from_checkpoint=...)), or start a "
                         "new group and roll back to one")
    return live[0] if live else None


def _await_places(group: "WorkerGroup", slots: Sequence[Slot], ranks: Sequence[int]) -> None:
    """Before new workers go into the places of retired ones: wait for the places to be on live
    nodes (Ray moves the bundles of a lost node where there is room).

    Raises:
        GroupError: a place did not come back within ``placement_timeout_s``, naming the ranks.
    """
    if not await_bundles([(s.pg, s.bundle) for s in slots], group.placement_timeout_s):
        names = ", ".join(str(r) for r in ranks)
        raise GroupError(f"the place of rank(s) {names} is gone (its node left the cluster) and no node took it "
                         f"within {group.placement_timeout_s:g} s: continue with fewer workers "
                         "(%dist_rescale N, group.rescale(n)), or add a node and restart again")


def replace_ranks(group: "WorkerGroup", ranks: List[int], from_checkpoint: bool = False) -> None:
    """New actors in the places of ``ranks``; state from the lowest surviving rank (none needed when a
    checkpoint is loaded next)."""
    src = _survivor(group, ranks, from_checkpoint)
    slots = group.slots
    group.transition(GroupState.RECOVERING)
    try:
        spares = len(slots.spares)
        if len(ranks) > spares:  # new workers go into the old places: wait until usable
            retire([slots[r] for r in ranks])
            _await_places(group, [slots[r] for r in ranks[spares:]], ranks[spares:])
        else:  # spares take every place: no wait, spares are for speed
            for r in ranks:
                _kill(slots[r])
        for r in ranks:
            spare = slots.take_spare()  # a standby worker, started and with torch imported
            old = slots.put(r, spare if spare is not None else group._spawn(*slots[r].place))
            if spare is not None:
                slots.spares.append(group._spawn(*old.place))  # refill in the background
                slots.spares[-1].actor.warm.remote()
        group._describe([slots[r] for r in ranks])
        _join_new(group, src, ranks, _prepare_new(group, ranks))
    except BaseException:
        for r in ranks:  # the new workers go; the survivors keep their state (and can rescale to fewer)
            _kill(slots[r])
            slots[r].mark(SlotState.DEAD, "its replacement failed to start")
        group.transition(GroupState.FAILED)
        raise
    group.transition(GroupState.IDLE)
    logger.info("replaced rank(s) %s; state %s", ranks, f"copied from rank {src}" if src is not None else
                "from their replayed cells, then the checkpoint")


def _fresh(group: "WorkerGroup") -> bool:
    """Whether the group's library cannot form its collective again in a live process (TensorFlow): then a
    restart or rescale starts fresh processes for every rank."""
    backend = frameworks.find(group.config.framework)
    return backend is not None and bool(backend.fresh_processes)


def restart(group: "WorkerGroup", from_checkpoint: bool = False) -> List[int]:
    group._check_not_running()
    group.status()  # ping every worker: a death Ray knows of but the monitor has not seen yet counts
    dead = group.slots.gone_ranks()
    if not dead:
        raise GroupError("no dead worker to restart: every rank is alive (%dist_status shows them)")
    if _fresh(group):
        _resize(group, group.num_workers, from_checkpoint)
    else:
        replace_ranks(group, dead, from_checkpoint)
    return dead


def _carry(group: "WorkerGroup", live: Sequence[int], from_checkpoint: bool) -> Optional[Any]:
    """Before every rank gets a fresh process: the tracked state of the lowest live rank, kept on the group
    until the new processes have it (a renewal that failed keeps it for the next restart). None when a
    checkpoint is loaded next."""
    if from_checkpoint:
        group.carried = None
        return None
    if live:
        data = group._get([group.slots[live[0]].actor.carry_state.remote()], group.start_timeout_s,
                          f"rank {live[0]} to hand over its state before fresh processes replace")[0]
        group.carried = (live[0], data)
    if group.carried is None:
        raise GroupError("no live worker is left to copy the state from: restart from a checkpoint "
                         "(%dist_restart --from-checkpoint NAME, group.restart(from_checkpoint=...)), or start a "
                         "new group and roll back to one")
    return group.carried


def _load_carried(group: "WorkerGroup", carried: Any) -> None:
    """Load the carried state into every (fresh) rank; names no replayed cell made are said, not loaded."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    src, data = carried
    ref = ray.put(data)
    results = group._get([s.actor.load_carried.remote(ref) for s in group.slots], group.start_timeout_s,
                         "load the state carried from the old processes into")
    missing = results[0]["missing"]
    if missing:
        line = (f"{', '.join(missing)}: made in cells that are not replayed, so the fresh processes lack them and "
                f"rank {src}'s state for them is gone; mark their cell --setup, or run it again")
        logger.warning("%s", line)
        group.replay_failures.append(line)
    group.carried = None


def rescale(group: "WorkerGroup", num_workers: int) -> None:
    group._check_not_running()
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise GroupError(f"rescale to {num_workers!r} workers is not possible: give a whole number of at least 1")
    group.status()  # ping every worker: a death Ray knows of but the monitor has not seen yet counts
    if not group.slots.live_ranks() and not (_fresh(group) and group.carried is not None):
        raise GroupError("every worker is dead: nothing to keep; shut the group down and start a new one")
    _resize(group, num_workers)


def _resize(group: "WorkerGroup", num_workers: int, from_checkpoint: bool = False) -> None:
    """Rescale to ``num_workers``: the live workers stay (the lowest ranks first) and new ones join them; on a
    backend that needs fresh processes every rank is new, its state carried over from the lowest live rank
    and loaded after the setup cells replayed (``from_checkpoint``: nothing carried, a checkpoint follows)."""
    slots = group.slots
    fresh = _fresh(group)
    alive = [slots[r] for r in slots.live_ranks()]
    carried = _carry(group, slots.live_ranks(), from_checkpoint) if fresh else None
    keep = [] if fresh else alive[:num_workers]
    drop = [s for s in alive if s not in keep] + [slots[r] for r in slots.gone_ranks()]
    need = num_workers - len(keep)
    shared = share_cpus(dataclasses.replace(group.config, num_workers=num_workers, cpus_per_worker=group.cpus_asked),
                        num_workers)  # new workers take the share of the new size
    group.config = dataclasses.replace(group.config, cpus_per_worker=shared.cpus_per_worker)
    check_cluster(dataclasses.replace(group.config, num_workers=num_workers), num_workers)
    extra_pg, extra_size = None, 0
    if need > len(drop) + len(slots.free):  # reserve the rest before touching anything: fail fast
        extra_size = need - len(drop) - len(slots.free)
        extra_pg = reserve(dataclasses.replace(group.config, num_workers=extra_size), extra_size,
                           group.placement_timeout_s)
        slots.pgs.append(extra_pg)
    group.transition(GroupState.RECOVERING)
    try:
        if need:  # new workers go first into the places of dropped or lost ones that are still on live nodes
            retire(drop)
        else:
            for slot in drop:
                _kill(slot)
        slots.free.extend(slot.place for slot in drop)
        places: List[Place] = []
        if need:
            places = [p for p, ok in zip(slots.free, bundles_placed(slots.free)) if ok][:need]
            for place in places:
                slots.free.remove(place)
            if extra_pg is not None:
                places += [(extra_pg, i) for i in range(min(need - len(places), extra_size))]
            if len(places) < need:  # lost places: reserve new ones where the cluster has room
                more = need - len(places)
                pg = reserve(dataclasses.replace(group.config, num_workers=more), more, group.placement_timeout_s)
                slots.pgs.append(pg)
                places += [(pg, i) for i in range(more)]
        new = [group._spawn(pg, bundle) for pg, bundle in places]
        slots.assign(keep + new)
        new_ranks = list(range(len(keep), num_workers))
        failed: Dict[int, List[str]] = {}
        if new:
            group._describe(new)
            failed = _prepare_new(group, new_ranks)
        _join_new(group, None if fresh else 0, new_ranks, failed)
        group.config = dataclasses.replace(group.config, num_workers=num_workers)
        if carried is not None:
            _load_carried(group, carried)
    except BaseException as exc:
        if fresh:
            _renewal_failed(group)
        elif isinstance(exc, RecoveryError):
            _back_to(group, keep, new)
        else:
            group.transition(GroupState.FAILED)
        raise
    group.transition(GroupState.IDLE)
    logger.info("%s %d workers%s", "renewed" if fresh else "rescaled to", num_workers,
                " (fresh processes for every rank)" if fresh else "")


def _renewal_failed(group: "WorkerGroup") -> None:
    """Fresh processes for every rank did not come up: every one goes (none has the state), and the state
    handed over stays on the group for the next restart, which then needs no live rank."""
    for slot in group.slots:
        _kill(slot)
        slot.mark(SlotState.DEAD, "fresh processes for every rank failed to start")
    group.transition(GroupState.FAILED)
    if group.carried is not None:
        logger.warning("the state of rank %d is kept: %%dist_restart (group.restart()) again starts fresh processes "
                       "and loads it", group.carried[0])


def _back_to(group: "WorkerGroup", keep: List[Slot], new: List[Slot]) -> None:
    """After a rescale the new ranks could not join: drop them and re-form the kept workers as they were."""
    for slot in new:
        _kill(slot)
        group.slots.free.append(slot.place)
    group.slots.assign(keep)
    try:
        group._rendezvous("join", src=0)
    except BaseException:
        group.transition(GroupState.FAILED)
        raise
    group.config = dataclasses.replace(group.config, num_workers=len(keep))
    group.transition(GroupState.IDLE)


def recover_and_retry(group: "WorkerGroup", exc: Exception, policy: str, attempt: int, max_failures: int,
                      sink: Any) -> bool:
    """Apply ``--on-failure``: recover from dead workers and say so; False to re-raise."""
    deaths = [f for f in getattr(exc, "failures", []) if f.type_name in ("WorkerDiedError", "WorkerUnresponsiveError")]
    if policy == "raise" or not deaths or (0 <= max_failures <= attempt):
        return False
    ranks = ", ".join(str(f.rank) for f in deaths)
    limit = "no limit" if max_failures < 0 else f"{attempt + 1}/{max_failures}"
    sink.notice(f"rank(s) {ranks} died ({deaths[0].message.split(': ', 1)[-1]}); --on-failure {policy} "
                f"({limit}): recovering, then running the cell again")
    if policy == "restart":
        restart(group)
    else:
        rescale(group, len(group.slots.live_ranks()))
    return True
