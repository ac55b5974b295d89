"""Forming a group: spawning worker actors, ordering ranks by node, joining the process group."""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, List, Sequence

from .. import cluster
from ..errors import GroupError
from ..worker.actor import remote_worker_class
from .fanout import collect
from .monitor import DEFAULT_HEARTBEAT_TIMEOUT_S
from .ranks import assign_ranks, rank_infos
from .slots import Slot
from .state import SlotState
from .steps import await_settled, await_step
from .timing import CONTROL_START_S, SETTLE_S

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"


def loopback_env(local: bool) -> Dict[str, str]:
    """Where gloo and NCCL open their sockets: the loopback interface when every rank is on this machine
    ("" removes a setting left by an earlier, single-machine formation)."""
    value = "lo" if local else ""
    return {"GLOO_SOCKET_IFNAME": value, "NCCL_SOCKET_IFNAME": value}


class FormationMixin:
    """How a :class:`~raytrain_nb.WorkerGroup` starts workers and (re-)forms its process group."""

    # -- forming the group ---------------------------------------------------------------

    def _spawn(self, pg: Any, bundle: int) -> Slot:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy  # ray: on first use

        opts: Dict[str, Any] = dict(
            num_cpus=self.config.cpus_per_worker,
            num_gpus=self.config.gpus_per_worker,
            resources=dict(self.config.resources_per_worker or {}),
            max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle),
        )
        shipped = cluster.shipped_working_dir()  # then Ray runs workers in a copy of the folder
        cwd = None if shipped else os.getcwd()
        actor = remote_worker_class().options(**opts).remote(cwd=cwd, sys_path=[] if shipped else [os.getcwd()],
                                                             preload=self.kind.preload)
        return Slot(actor=actor, pg=pg, bundle=bundle, info={})

    def _describe(self, slots: List[Slot]) -> None:
        infos = self._get([s.actor.info.remote() for s in slots], self.start_timeout_s, "start")
        for slot, info in zip(slots, infos):
            slot.info = info

    def _order(self, slots: List[Slot]) -> List[Slot]:
        self._describe(slots)
        order = assign_ranks([s.info["node_id"] for s in slots], cluster.driver_node_id())
        return [slots[i] for i in order]

    def _contexts(self) -> List[Any]:
        infos = rank_infos([s.info["node_id"] for s in self.slots])
        for slot, info in zip(self.slots, infos):
            slot.rank_info = info
        return infos

    def _rendezvous(self, method: str, src: int = 0, fresh: Sequence[int] = (), anew: bool = False) -> List[Any]:
        """Form the process group over ``self.slots`` in rank order.

        ``setup`` on a new group; ``join`` to re-form one (after an interrupt,
        a failure or a resize), broadcasting replicated state from rank ``src``;
        ranks in ``fresh`` also receive what they lack. ``anew``: every rank is new (a restart from a
        checkpoint with no survivor), none receives anything. Returns each rank's answer.
        """
        await_settled(list(self.slots), SETTLE_S)
        if method == "join" and not anew:  # a worker that never completed a formation (a failed one's) is new too
            fresh = sorted(set(fresh) | {r for r, s in enumerate(self.slots) if not s.joined})
            if src in fresh:
                held = [r for r in range(len(self.slots)) if r not in fresh]
                if not held:
                    raise GroupError("no worker holds the group's state (every one is new): shut the group down "
                                     "and start a new one, then roll back to a checkpoint")
                src = held[0]
        infos = self._contexts()
        master = self.slots[0]
        # Ranks all on one machine talk over loopback only: nothing we open listens on other interfaces.
        local = len({s.info["node_id"] for s in self.slots}) == 1
        addr = LOOPBACK if local else master.info["node_ip"]
        port = 0
        if self.kind.process_group:
            port = self._get([master.actor.open_store.remote(addr, len(self.slots))], CONTROL_START_S, "start")[0]
        refs = []
        for rank, (slot, info) in enumerate(zip(self.slots, infos)):
            ctx, env = info.context(self.name), dict(info.env(addr, port), **loopback_env(local))
            if method == "setup":
                refs.append(slot.actor.setup.remote(ctx, env, self.backend, addr, port))
            else:
                refs.append(slot.actor.join.remote(ctx, env, addr, port, src, rank in fresh,
                                                   sorted(self.rank_specific)))
        step = "_setup" if method == "setup" else "_join"
        results = await_step(list(self.slots), refs, step, self.start_timeout_s, self._heartbeat_s())
        self._note_missing(results)
        for slot, res in zip(self.slots, results):
            if method == "setup":
                slot.device = res["device"]
            slot.mark(SlotState.IDLE)
            slot.joined = True
        return results

    def _note_missing(self, results: List[Any]) -> None:
        """Say which names each rank could not get from its peer (``results[r]["missing"]``, from joining or
        from the driver's copy): they differ across ranks and no cell that made them is replayed."""
        for rank, res in enumerate(results):
            for name in res.get("missing", []) if isinstance(res, dict) else []:
                line = f"rank {rank}: {name!r} was made in a cell that is not replayed and differs across " \
                       "ranks, so no peer's copy is right; mark that cell --setup if new ranks need it"
                logger.warning("%s", line)
                self.replay_failures.append(line)

    def _heartbeat_s(self) -> float:
        monitor = getattr(self, "_monitor", None)
        return monitor.heartbeat_timeout_s if monitor is not None else DEFAULT_HEARTBEAT_TIMEOUT_S

    def _get(self, refs: List[Any], timeout: float, what: str) -> List[Any]:
        """Every rank's answer to ``refs`` (one call per slot of the group, in rank order, or of the workers
        being started) within ``timeout`` (saying what it waits for after 5 s).

        Raises:
            WorkerDiedError: a worker died (naming its rank, pid, node and Ray's cause).
            GroupError: a rank did not answer in time, or raised; one line naming what.
        """
        return collect(refs, timeout, f"the workers to {what} the group", self.slots,
                       hint="raise start_timeout_s or check `ray status`")

    def _reform(self) -> None:
        self._rendezvous("join")
