"""Taking over a keep-alive group from another (or a dead) kernel: find its custodian, claim it, rebuild the core.

``WorkerGroup.attach`` calls :func:`claim`, which connects to the group's instance (the shared one, found by our
record, or ``address``), picks the group (the only one, or the one named), claims it from its custodian (refused
while its owner kernel is alive, unless ``steal``) and returns a :class:`GroupCore` rebuilt from what the old driver
handed over: config, settings, cell history, pushed values, metrics, the workers (each pinged: a dead one shows
dead, so ``restart`` replaces it) and their places. Opening the run storage takes the run's lease and commits what
every rank reported meanwhile (the crash path of ``checkpoint/run_storage.py``). :func:`alive_groups` is
``%dist_groups``: every keep-alive group's custodian, described.
"""
from __future__ import annotations

import collections
import logging
import os
from typing import Any, Dict, List, Optional, Tuple

from .. import cluster, instance
from ..checkpoint.lease import LEASE_FILE
from ..checkpoint.run_storage import RunStorage
from ..checkpoint.storage import join, resolve
from ..errors import GroupError
from .adopted import adopt
from .core import METRICS_HISTORY, GroupCore
from .custodian import PREFIX
from .fanout import FANOUT
from .formation import Formation
from .slots import Slot
from .state import GroupState, SlotState
from .survival import new_owner
from .timing import CONTROL_CALL_S, PING_S

logger = logging.getLogger(__name__)

__all__ = ["adopt", "alive_groups", "claim", "connect", "custodians"]


def connect(address: Optional[str]) -> None:
    """Connect to where keep-alive groups live: ``address`` (or ``RAY_ADDRESS``), else the shared instance.

    Raises:
        GroupError: no shared instance runs on this machine (nothing outlived a kernel here).
    """
    if not (address or os.environ.get("RAY_ADDRESS")) and not cluster.on_shared_instance() \
            and instance.read_record() is None:
        raise GroupError(f"no group outlived a kernel on this machine: no shared Ray instance is recorded in "
                         f"{instance.record_path()} (start groups with --keep-alive to keep them past a kernel)")
    cluster.connect(address, shared=True)


def custodians() -> List[str]:
    """The runs of every keep-alive group alive where this process is connected."""
    import ray  # ray: loaded when a group runs

    return sorted(n[len(PREFIX):] for n in ray.util.list_named_actors() if n.startswith(PREFIX))


def alive_groups(address: Optional[str] = None) -> List[Dict[str, Any]]:
    """One description per keep-alive group alive (run, size, owner and whether it is alive, age, idle, keep-alive
    left); a group that ends meanwhile is left out."""
    import ray  # ray: loaded when a group runs

    connect(address)
    refs = []
    for run in custodians():
        try:
            refs.append(ray.get_actor(PREFIX + run).describe.remote())
        except ValueError:
            continue
    rows = []
    for ref in refs:
        try:
            rows.append(ray.get(ref, timeout=CONTROL_CALL_S))
        except Exception as exc:  # noqa: BLE001 - ended meanwhile
            logger.debug("a custodian did not describe its group: %s", exc)
    return rows


def _pick(run: Optional[str]) -> str:
    runs = custodians()
    if run is not None:
        if run not in runs:
            raise GroupError(f"no keep-alive group {run!r} is alive here; alive: {', '.join(runs) or 'none'} "
                             "(%dist_groups lists them)")
        return run
    if not runs:
        raise GroupError("no keep-alive group is alive here (it may have run out of keep-alive: see its run's "
                         "events.log)")
    if len(runs) > 1:
        raise GroupError(f"{len(runs)} keep-alive groups are alive: {', '.join(runs)}; name one: %dist_attach RUN "
                         "(%dist_groups describes them)")
    return runs[0]


def claim(run: Optional[str], steal: bool, address: Optional[str]) -> Tuple[GroupCore, Any, Dict[str, Any], str]:
    """Claim a keep-alive group and rebuild its core.

    Returns:
        (core, custodian handle, owner, note): ``note`` says what the user should know (stolen from whom).

    Raises:
        GroupError: no such group, several and none named, or its owner kernel is alive (without ``steal``).
    """
    import ray  # ray: loaded when a group runs
    from ray import cloudpickle  # ray: as above

    connect(address)
    name = _pick(run)
    custodian = ray.get_actor(PREFIX + name)
    owner = new_owner()
    got = ray.get(custodian.claim.remote(owner, steal), timeout=CONTROL_CALL_S)
    if got.get("refused"):
        raise GroupError(got["refused"])
    state = cloudpickle.loads(got["state"])
    settings = state["settings"]
    if got["stolen_from"]:  # the old owner is alive and still holds the run's lease: it is taken from it
        fs, path = resolve(state["url"])
        try:
            fs.rm_file(join(path, LEASE_FILE))
        except FileNotFoundError:
            pass
    keep, attr, order = state["storage"]
    storage = RunStorage(settings.storage_path, settings.name, keep, attr, order, owner=f"group {settings.name!r}")
    core = GroupCore(state["config"], settings, storage)
    _fill(core, state, got["workers"], got["pgs"])
    note = f"taken over from {got['stolen_from']}" if got["stolen_from"] else ""
    return core, custodian, owner, note


def _fill(core: GroupCore, state: Dict[str, Any], workers: List[Any], pgs: List[Any]) -> None:
    """The core's history, pushed values, metrics and slots from the handed-over state; dead workers marked."""
    core.continue_after(state["history"])
    core.pushed.update(state["pushed"])
    core.rank_specific.update(state["rank_specific"])
    core.latest_metrics.update(state["latest"])
    for rank, records in state["metrics"].items():
        for rec in records:
            core.metrics_history.setdefault(rank, collections.deque(maxlen=METRICS_HISTORY)).append(rec)
    core.slots.pgs.extend(pgs)
    n = len(state["slots"])
    slots = []
    for actor, (pg, bundle, device, info, joined) in zip(workers[:n], state["slots"]):
        slot = Slot(actor=actor, pg=pgs[pg], bundle=bundle, info=dict(info), device=device)
        slot.joined = joined
        slots.append(slot)
    core.slots.assign(slots)
    Formation(core).contexts()  # each slot's rank info, from its node (as a formation sets it)
    core.slots.spares = [Slot(actor=a, pg=pgs[pg], bundle=b, info=dict(info))
                         for a, (pg, b, info) in zip(workers[n:], state["spares"])]
    core.slots.free[:] = [(pgs[pg], b) for pg, b in state["free"]]
    replies = FANOUT.ask(slots, lambda s: s.actor.ping.remote(), PING_S, "every rank of the group taken over")
    for slot, reply in zip(slots, replies):
        slot.mark(SlotState.IDLE if reply.ok else SlotState.DEAD, "" if reply.ok else str(reply.error))
    core.transition(GroupState.IDLE)
    if core.slots.gone_ranks():
        core.transition(GroupState.FAILED)
