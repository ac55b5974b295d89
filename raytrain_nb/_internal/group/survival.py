"""A keep-alive group's driver side: its custodian made or claimed, the heartbeat, the state handed over.

Only a group with ``keep_alive > 0`` has one (``WorkerGroup(keep_alive=...)``); a group without costs nothing here.
:class:`Survival` beats to the custodian every :data:`BEAT_S` from a thread (the custodian calls a driver silent
for ``custodian.OWNER_SILENT_S`` gone), sends it the workers' handles and the driver's state each time the group
settles (idle or failed), and hears from a beat when another kernel took the group over (``core.taken_by``: every
command of this kernel is refused from then on, saying so).
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Dict, Optional

from ..durations import parse_duration
from ..errors import GroupError
from ..waits import wait_until
from .active import leave
from .custodian import Custodian, actor_name
from .retiring import teardown
from .state import GroupState
from .timing import CONTROL_CALL_S

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)

BEAT_S = 1.0
#: Reported metrics per rank handed over (the dashboard's plot after an attach).
METRICS_KEPT = 1000


def new_owner() -> Dict[str, Any]:
    """Who this driver is, for the custodian's messages (``token`` is its identity)."""
    return {"token": uuid.uuid4().hex, "pid": os.getpid(), "host": socket.gethostname()}


def driver_state(core: "GroupCore") -> bytes:
    """What a new driver needs besides the handles: config, settings, history, pushed values, metrics, slots."""
    from ray import cloudpickle  # ray: loaded when a group runs

    pgs = list(core.slots.pgs)
    manager = core.run_storage.manager
    state = {"url": core.run_storage.url, "config": core.config, "settings": core.settings, "history": list(core.history),
             "pushed": dict(core.pushed), "rank_specific": sorted(core.rank_specific),
             "metrics": {r: list(d)[-METRICS_KEPT:] for r, d in core.metrics_history.items()},
             "latest": dict(core.latest_metrics),
             "slots": [(pgs.index(s.pg), s.bundle, s.device, s.info, s.joined) for s in core.slots],
             "spares": [(pgs.index(s.pg), s.bundle, s.info) for s in core.slots.spares],
             "free": [(pgs.index(pg), b) for pg, b in core.slots.free],
             "storage": (manager.num_to_keep, manager.score_attribute, manager.score_order)}
    try:
        return cloudpickle.dumps(state)
    except Exception as exc:  # noqa: BLE001 - a pushed value that does not pickle: the rest is handed over
        logger.warning("a pushed value of group %s cannot be handed to the next kernel (%s): left out", core.name, exc)
        state["pushed"] = {}
        return cloudpickle.dumps(state)


class Survival:
    """The driver's link to its keep-alive group's custodian.

    Args:
        core: the group's core. custodian: the claimed custodian's handle (an attach), or None to make one.
        owner: this driver (:func:`new_owner`), the one that claimed it when ``custodian`` is given.
    """

    def __init__(self, core: "GroupCore", custodian: Any = None, owner: Optional[Dict[str, Any]] = None) -> None:
        import ray  # ray: loaded when a group runs

        self.core = core
        self.owner = owner or new_owner()
        if custodian is None:
            custodian = ray.remote(Custodian).options(
                name=actor_name(core.name), lifetime="detached", num_cpus=0, max_concurrency=4,
                max_restarts=0).remote(core.name, core.run_storage.url, core.settings.keep_alive_s, self.owner)
        self.custodian = custodian
        self._stop = threading.Event()
        self.send()
        ray.get(self.custodian.beat.remote(self.owner["token"], False), timeout=60)  # it is up: checked once
        core.subscribe(self._settled)
        core.owner_check = self.check
        self._thread = threading.Thread(target=self._beat, name="rtnb-survival", daemon=True)
        self._thread.start()

    @classmethod
    def start(cls, core: "GroupCore", claimed: Optional[tuple]) -> "Survival":
        """The link of a new keep-alive group (its custodian made; the group torn down if that fails) or of one
        ``claimed`` (custodian, owner) from another kernel."""
        try:
            return cls(core, *(claimed or ()))
        except BaseException:
            if claimed is None:
                teardown(core)
            raise

    @property
    def token(self) -> str:
        return self.owner["token"]

    def _signature(self) -> tuple:
        """What changes the handed-over state (cells, pushed names, workers, reports), cheap to compare each beat."""
        core = self.core
        return (len(core.history), tuple(core.pushed), tuple(id(s.actor) for s in core.slots.everyone()),
                sum(len(d) for d in core.metrics_history.values()), core.state)

    def send(self) -> None:
        """Hand the custodian the workers' handles and the driver's state (a call that returns at once)."""
        slots = self.core.slots
        self._sent = self._signature()
        self._seq = getattr(self, "_seq", 0) + 1  # the custodian keeps the newest (its calls may run out of order)
        self.custodian.update.remote(self.token, self._seq, [s.actor for s in slots.everyone()], list(slots.pgs),
                                     driver_state(self.core))

    def _settled(self, old: GroupState, new: GroupState) -> None:
        if new in (GroupState.IDLE, GroupState.FAILED) and not self._stop.is_set():
            self.send()

    def _beat(self) -> None:
        import ray  # ray: loaded when a group runs

        while not self._stop.wait(BEAT_S):
            if self._signature() != self._sent:  # e.g. the cell history, appended after the group settled
                self.send()
            try:
                said = ray.get(self.custodian.beat.remote(self.token, self.core.state is GroupState.RUNNING),
                               timeout=CONTROL_CALL_S)
            except Exception as exc:  # noqa: BLE001 - a custodian that is gone: the group ended on the cluster
                if isinstance(exc, ray.exceptions.RayActorError):
                    self.core.taken_by = (f"group {self.core.name} ended on the cluster (its custodian is gone; see "
                                          f"{self.core.run_storage.url}/events.log)")
                    return
                logger.debug("heartbeat to the custodian of %s: %s", self.core.name, exc)
                continue
            if said:
                self.core.taken_by = said
                logger.warning("%s", said)
                return

    def check(self) -> str:
        """Ask the custodian now whether this driver still owns the group (before a command: ~2 ms); sets and
        returns ``core.taken_by`` when not. A custodian that does not answer in time is not taken as a refusal."""
        import ray  # ray: loaded when a group runs

        if self._stop.is_set():
            return self.core.taken_by
        try:
            said = ray.get(self.custodian.beat.remote(self.token, self.core.state is GroupState.RUNNING),
                           timeout=CONTROL_CALL_S)
        except Exception as exc:  # noqa: BLE001 - gone: the heartbeat thread says so; slow: the command goes on
            logger.debug("ownership check of %s: %s", self.core.name, exc)
            return self.core.taken_by
        if said:
            self.core.taken_by = said
        return said

    def stop(self) -> None:
        self._stop.set()

    def detach(self, keep_alive_s: Optional[float]) -> float:
        """Stop beating and hand the group to the custodian (the lease is given back first, by the caller)."""
        import ray  # ray: loaded when a group runs

        self.send()
        self.stop()
        return float(ray.get(self.custodian.detach.remote(self.token, keep_alive_s), timeout=CONTROL_CALL_S))

    def set_keep_alive(self, keep_alive_s: float) -> None:
        self.custodian.set_keep_alive.remote(self.token, keep_alive_s)

    def end(self, reason: str) -> None:
        """The group was shut down by this driver: its custodian goes (it exits after answering)."""
        import ray  # ray: loaded when a group runs

        self.stop()
        try:
            ray.get(self.custodian.end.remote(self.token, reason), timeout=CONTROL_CALL_S)
        except Exception as exc:  # noqa: BLE001 - gone already is fine
            logger.debug("ending the custodian of %s: %s", self.core.name, exc)
        name = actor_name(self.core.name)

        def freed(slice_s: float) -> bool:
            try:
                ray.get_actor(name)
            except ValueError:
                return True
            time.sleep(min(slice_s, 0.05))  # Ray frees the name once the custodian's process has exited
            return False

        # shut down means gone from %dist_groups and its name free for a new group, before the magic returns
        if not wait_until(freed, CONTROL_CALL_S, f"the custodian of {self.core.name} to exit", logger):
            logger.warning("the custodian of %s did not exit within %.0f s; %%dist_groups may list it a while",
                           self.core.name, CONTROL_CALL_S)


def detach(group: Any, core: "GroupCore", survival: Optional[Survival], monitor: Any, keep_alive: Any) -> float:
    """Hand a keep-alive group to its custodian: this driver stops watching and gives the run's lease back; the
    group lives for ``keep_alive`` (default: its own) unless a kernel attaches it. Returns those seconds.

    Raises:
        GroupError: the group has no keep-alive (it ends with its kernel), or is not driven from here.
    """
    if survival is None:
        raise GroupError(f"group {core.name} was started without a keep-alive and ends with its kernel: start it "
                         "with --keep-alive DURATION (WorkerGroup(keep_alive=...)) to detach it later")
    if core.taken_by:
        raise GroupError(core.taken_by)
    seconds = None if keep_alive is None else parse_duration(keep_alive)
    if monitor is not None:
        monitor.stop()
    core.run_storage.close()  # the custodian takes the lease from here
    left = survival.detach(seconds)
    core.taken_by = f"group {core.name} was detached from this kernel: %dist_attach {core.name} takes it back"
    leave(group)  # the magics no longer act on it here
    return left
