"""Replacing dead workers and resizing a live group, keeping the warm state.

A new worker rebuilds its namespace by replaying the group's setup cells with
collectives deferred (``prepare_model`` returns a DDP object bound later);
then every rank joins a new process group and the replicated state is
broadcast from a live peer (see :mod:`.replicate`).
"""
from __future__ import annotations

import dataclasses
import logging
from typing import TYPE_CHECKING, Any, List, Sequence

from .errors import GroupError
from .placement import await_bundles, await_recorded_deaths, bundles_placed, check_cluster, reserve

if TYPE_CHECKING:
    from .group import WorkerGroup, _Slot

logger = logging.getLogger(__name__)

_GONE = ("dead", "unresponsive")
ON_FAILURE = ("raise", "restart", "rescale")


def _kill(slot: "_Slot") -> None:
    import ray

    try:
        ray.kill(slot.actor, no_restart=True)
    except Exception:  # noqa: BLE001 - already gone
        pass


def retire(slots: Sequence["_Slot"]) -> None:
    """Kill the workers of ``slots`` so their places can take new ones.

    The dead ones are first left to Ray to record as dead: a process that died on a live node is
    recorded at once, one on a lost node only when Ray declares the node dead, and until then the
    node's placement-group bundles still look usable (a worker started there dies at once). Killing
    them ourselves would have Ray record them dead at once and hide that.
    """
    await_recorded_deaths([s.actor for s in slots if s.state == "dead"])
    for slot in slots:
        _kill(slot)


def _prepare_new(group: "WorkerGroup", ranks: Sequence[int]) -> None:
    """Set up the workers of ``ranks`` without joining, then replay the setup cells on them."""
    # The run directory first: report(checkpoint=...) and get_checkpoint() work on a new rank too.
    group._get([group._slots[r].actor.set_storage.remote(group.run_storage.url) for r in ranks], 60, "start")
    infos = group._contexts()
    addr = group._slots[0].info.get("node_ip", "127.0.0.1")
    refs = [group._slots[r].actor.setup.remote(infos[r].context(group.name), infos[r].env(addr, 0),
                                               group.backend, addr, 0, True) for r in ranks]
    for r, res in zip(ranks, group._get(refs, group.start_timeout_s, "start")):
        group._slots[r].device = res["device"]
    cells = [(c.cell_id, c.source) for c in group.history if c.setup]
    if cells:
        failed = group._get([group._slots[r].actor.replay.remote(cells) for r in ranks], group.start_timeout_s,
                            "replay the setup cells of")
        for r, lines in zip(ranks, failed):
            for line in lines:  # the rank still joins: the state broadcast follows
                logger.warning("rank %d: replaying %s", r, line)
                group.replay_failures.append(f"rank {r}: {line}")


def _survivor(group: "WorkerGroup", new: Sequence[int]) -> int:
    live = [r for r in range(group.num_workers) if r not in new]
    if not live:
        raise GroupError("no live worker is left to copy the state from: start a new group (and roll back "
                         "to a checkpoint), or restart from a checkpoint")
    return live[0]


def _await_places(group: "WorkerGroup", slots: Sequence["_Slot"], ranks: Sequence[int]) -> None:
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


def replace_ranks(group: "WorkerGroup", ranks: List[int]) -> None:
    """New actors in the places of ``ranks``; state from the lowest surviving rank."""
    from .group import GroupState

    src = _survivor(group, ranks)
    group._set_state(GroupState.RECOVERING)
    try:
        if len(ranks) > len(group._spares):  # new workers go into the old places: wait until usable
            retire([group._slots[r] for r in ranks])
            _await_places(group, [group._slots[r] for r in ranks[len(group._spares):]], ranks[len(group._spares):])
        else:  # spares take every place: no wait, spares are for speed
            for r in ranks:
                _kill(group._slots[r])
        for r in ranks:
            old = group._slots[r]
            if group._spares:  # a standby worker, started and with torch imported
                group._slots[r] = group._spares.pop(0)
                group._spares.append(group._spawn(old.pg, old.bundle))  # refill in the background
                group._spares[-1].actor.warm.remote()
            else:
                group._slots[r] = group._spawn(old.pg, old.bundle)
        group._describe([group._slots[r] for r in ranks])
        _prepare_new(group, ranks)
        group._rendezvous("join", src=src, fresh=ranks)
    except BaseException:
        group._set_state(GroupState.FAILED)
        raise
    group._set_state(GroupState.IDLE)
    logger.info("replaced rank(s) %s; state copied from rank %d", ranks, src)


def restart(group: "WorkerGroup") -> List[int]:
    group._check_not_running()
    group.status()  # ping every worker: a death Ray knows of but the monitor has not seen yet counts
    dead = [r for r, s in enumerate(group._slots) if s.state in _GONE]
    if not dead:
        raise GroupError("no dead worker to restart: every rank is alive (%dist_status shows them)")
    replace_ranks(group, dead)
    return dead


def rescale(group: "WorkerGroup", num_workers: int) -> None:
    from .group import GroupState

    group._check_not_running()
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise GroupError(f"rescale to {num_workers!r} workers is not possible: give a whole number of at least 1")
    alive = [s for s in group._slots if s.state not in _GONE]
    if not alive:
        raise GroupError("every worker is dead: nothing to keep; shut the group down and start a new one")
    keep, drop = alive[:num_workers], alive[num_workers:] + [s for s in group._slots if s.state in _GONE]
    need = num_workers - len(keep)
    check_cluster(dataclasses.replace(group.config, num_workers=num_workers), num_workers)
    extra_pg, extra_size = None, 0
    if need > len(drop) + len(group._free):  # reserve the rest before touching anything: fail fast
        extra_size = need - len(drop) - len(group._free)
        extra_pg = reserve(dataclasses.replace(group.config, num_workers=extra_size), extra_size,
                           group.placement_timeout_s)
        group._pgs.append(extra_pg)
    group._set_state(GroupState.RECOVERING)
    try:
        if need:  # new workers go first into the places of dropped or lost ones that are still on live nodes
            retire(drop)
        else:
            for slot in drop:
                _kill(slot)
        group._free.extend((slot.pg, slot.bundle) for slot in drop)
        places: List[Any] = []
        if need:
            places = [p for p, ok in zip(group._free, bundles_placed(group._free)) if ok][:need]
            for place in places:
                group._free.remove(place)
            if extra_pg is not None:
                places += [(extra_pg, i) for i in range(min(need - len(places), extra_size))]
            if len(places) < need:  # lost places: reserve new ones where the cluster has room
                more = need - len(places)
                pg = reserve(dataclasses.replace(group.config, num_workers=more), more, group.placement_timeout_s)
                group._pgs.append(pg)
                places += [(pg, i) for i in range(more)]
        new = [group._spawn(pg, bundle) for pg, bundle in places]
        group._slots = keep + new
        new_ranks = list(range(len(keep), num_workers))
        if new:
            group._describe(new)
            _prepare_new(group, new_ranks)
        group._rendezvous("join", src=0, fresh=new_ranks)
        group.config = dataclasses.replace(group.config, num_workers=num_workers)
    except BaseException:
        group._set_state(GroupState.FAILED)
        raise
    group._set_state(GroupState.IDLE)
    logger.info("rescaled to %d workers", num_workers)


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
        rescale(group, sum(1 for s in group._slots if s.state not in _GONE))
    return True
