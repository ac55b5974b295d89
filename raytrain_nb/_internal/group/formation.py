"""Forming a group: spawning worker actors, ordering ranks by node, joining the process group.

:class:`Formation` acts on a group's core (``core.py``): the group builds one when it starts, and the
recovery executor uses the same one to spawn, describe and join new workers.
"""
from __future__ import annotations

import logging
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Sequence

from .. import cluster
from ..errors import GroupError
from ..worker.actor import remote_worker_class
from .placement import reserve, share_cpus
from .ranks import assign_ranks, rank_infos
from .retiring import teardown
from .slots import Slot
from .state import SlotState
from .steps import await_settled, await_step
from .timing import CONTROL_START_S, SETTLE_S

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_last_epoch = [0]


def _next_epoch() -> int:
    """The number a join carries (see :meth:`Formation.rendezvous`): microseconds of the wall clock, rising in this
    process, so a driver that attached to a kept group later numbers its joins after the first driver's."""
    _last_epoch[0] = max(_last_epoch[0] + 1, time.time_ns() // 1000)
    return _last_epoch[0]


def loopback_env(local: bool) -> Dict[str, str]:
    """Where gloo and NCCL open their sockets: the loopback interface when every rank is on this machine
    ("" removes a setting left by an earlier, single-machine formation)."""
    value = "lo" if local else ""
    return {"GLOO_SOCKET_IFNAME": value, "NCCL_SOCKET_IFNAME": value}


def group_intact(outcomes: Sequence[Any], world_size: int, released: bool) -> bool:
    """Whether a cell's ranks may keep their process group: every one of the ``world_size`` ranks answered, none
    was released from a collective (``released``, or its group broken), and each counts the same collectives
    issued on each of its groups (``CellOutcome.pg_sequence``): every collective begun was finished on every rank,
    so none is left half done in the group."""
    if released or len(outcomes) != world_size or not outcomes:
        return False
    if any(o.pg_broken or o.dead or o.replaced or not o.pg_sequence for o in outcomes):
        return False
    return all(list(o.pg_sequence) == list(outcomes[0].pg_sequence) for o in outcomes)


class Formation:
    """How a group starts workers and (re-)forms its process group, over its ``core``."""

    def __init__(self, core: "GroupCore") -> None:
        self.core = core

    def start(self, check_storage: Callable[[str, str], Any]) -> None:
        """Reserve the places, start the workers and spares, form the group and check that every worker sees
        the run storage (``check_storage(url, token)`` runs on every rank). On a failure every worker started
        goes, the places are released and the run storage is closed.
        """
        core, n, spares = self.core, self.core.config.num_workers, self.core.settings.num_spares
        try:
            cluster.connect(core.settings.address, shared=core.settings.keep_alive_s > 0)
            core.config = share_cpus(core.config, n + spares)  # more than the machine has: shared
            core.slots.pgs.append(reserve(core.config, n + spares, core.settings.placement_timeout_s,
                                         core.settings.keep_alive_s > 0))
        except BaseException:
            core.run_storage.close()
            raise
        try:
            pg = core.slots.pgs[0]
            core.slots.spares = [self.spawn(pg, i) for i in range(n, n + spares)]
            for spare in core.slots.spares:
                spare.actor.warm.remote()
            core.slots.assign(self.order([self.spawn(pg, i) for i in range(n)]))
            self.rendezvous("setup")
            validates = core.run_storage.validator is not None  # report(validation=...) allowed
            core.collect([s.actor.set_storage.remote(core.run_storage.url, validates) for s in core.slots],
                         CONTROL_START_S, "start")
            core.run_storage.check_shared(check_storage, n)
        except BaseException:
            teardown(core)
            raise

    def spawn(self, pg: Any, bundle: int) -> Slot:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # ray: on first use

        opts: Dict[str, Any] = dict(
            num_cpus=self.core.config.cpus_per_worker,
            num_gpus=self.core.config.gpus_per_worker,
            resources=dict(self.core.config.resources_per_worker or {}),
            max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle),
        )
        if self.core.settings.keep_alive_s > 0:  # outlives this driver; its custodian ends it (custodian.py)
            opts["lifetime"] = "detached"
        if self.core.settings.runtime_env:
            opts["runtime_env"] = self.core.settings.runtime_env
        shipped = cluster.shipped_working_dir()  # then Ray runs workers in a copy of the folder
        cwd = None if shipped else os.getcwd()
        actor = remote_worker_class().options(**opts).remote(cwd=cwd, sys_path=[] if shipped else [os.getcwd()],
                                                             preload=self.core.kind.preload)
        return Slot(actor=actor, pg=pg, bundle=bundle, info={})

    def describe(self, slots: List[Slot]) -> None:
        infos = self.core.collect([s.actor.info.remote() for s in slots], self.core.settings.start_timeout_s,
                                  "start")
        for slot, info in zip(slots, infos):
            slot.info = info

    def order(self, slots: List[Slot]) -> List[Slot]:
        self.describe(slots)
        order = assign_ranks([s.info["node_id"] for s in slots], cluster.driver_node_id())
        return [slots[i] for i in order]

    def contexts(self) -> List[Any]:
        infos = rank_infos([s.info["node_id"] for s in self.core.slots])
        for slot, info in zip(self.core.slots, infos):
            slot.rank_info = info
        return infos

    @staticmethod
    def new_epoch() -> int:
        """A join's number, taken ahead: a recovery's early ``leave_group`` calls and then its join carry it."""
        return _next_epoch()

    def rendezvous(self, method: str, src: int = 0, fresh: Sequence[int] = (), anew: bool = False,
                   keep_shards: bool = False, keep_group: bool = False, epoch: int = 0) -> List[Any]:
        """Form the process group over the core's slots in rank order.

        ``setup`` on a new group; ``join`` to re-form one (after an interrupt,
        a failure or a resize), broadcasting replicated state from rank ``src``;
        ranks in ``fresh`` also receive what they lack. ``anew``: every rank is new (a restart from a
        checkpoint with no survivor), none receives anything. ``keep_shards``: the same ranks re-form, each
        keeping its own shards of sharded models (moved to the new group). ``keep_group``: every rank keeps the
        intact process group it is in and only brings its state in line over it (no rendezvous store is opened).
        ``epoch``: the number of this join (a recovery's own, which its early ``leave_group`` calls carry:
        ``executor.py``), else a new one; a leave that reaches a rank after a join of its number or later does
        nothing there.
        Returns each rank's answer.
        """
        core, slots = self.core, list(self.core.slots)
        await_settled(slots, SETTLE_S)
        if method == "join" and not anew:  # a worker that never completed a formation (a failed one's) is new too
            fresh = sorted(set(fresh) | {r for r, s in enumerate(slots) if not s.joined})
            if src in fresh:
                held = [r for r in range(len(slots)) if r not in fresh]
                if not held:
                    raise GroupError("no worker holds the group's state (every one is new): shut the group down "
                                     "and start a new one, then roll back to a checkpoint")
                src = held[0]
        epoch = epoch or _next_epoch()
        infos = self.contexts()
        master = slots[0]
        # Ranks all on one machine talk over loopback only: nothing we open listens on other interfaces.
        local = len({s.info["node_id"] for s in slots}) == 1
        addr = LOOPBACK if local else master.info["node_ip"]
        port = 0
        if core.kind.process_group and not keep_group:
            port = core.collect([master.actor.open_store.remote(addr, len(slots))], CONTROL_START_S, "start")[0]
        refs = []
        for rank, (slot, info) in enumerate(zip(slots, infos)):
            ctx, env = info.context(core.name), dict(info.env(addr, port), **loopback_env(local))
            if method == "setup":
                refs.append(slot.actor.setup.remote(ctx, env, core.backend, addr, port))
            else:
                refs.append(slot.actor.join.remote(ctx, env, addr, port, src, rank in fresh,
                                                   sorted(core.rank_specific), keep_shards, keep_group, bool(fresh),
                                                   epoch))
        step = "_setup" if method == "setup" else "_join"
        core.unformed = core.kind.process_group  # until every rank has formed it
        results = await_step(slots, refs, step, core.settings.start_timeout_s, core.heartbeat_s)
        core.unformed = False
        self.note_missing(results)
        for slot, res in zip(slots, results):
            if method == "setup":
                slot.device = res["device"]
            slot.mark(SlotState.IDLE)
            slot.joined = True
        return results

    def note_missing(self, results: List[Any]) -> None:
        """Say which names each rank could not get from its peer (``results[r]["missing"]``, from joining or
        from the driver's copy): they differ across ranks and no cell that made them is replayed."""
        for rank, res in enumerate(results):
            for name in res.get("missing", []) if isinstance(res, dict) else []:
                line = f"rank {rank}: {name!r} was made in a cell that is not replayed and differs across " \
                       "ranks, so no peer's copy is right; mark that cell --setup if new ranks need it"
                logger.warning("%s", line)
                self.core.replay_failures.append(line)

    def reform(self, keep_group: bool = False) -> None:
        """Form the process group again over the same workers (after an interrupt or a broken collective); sharded
        models keep their shards, moved onto the new group.

        ``keep_group`` (:func:`group_intact` said so): the ranks first try to keep the process group they are in,
        bringing their state in line over it as re-forming does; when that fails on any rank (its group was
        broken since), the ranks are released and the group re-forms."""
        if keep_group:
            try:
                self.rendezvous("join", keep_shards=True, keep_group=True)
                return
            except GroupError as exc:  # a RecoveryError too: the ranks were released
                if any(s.gone for s in self.core.slots):
                    raise
                logger.info("keeping the process group failed (%s): it re-forms", exc)
        self.rendezvous("join", keep_shards=True)
