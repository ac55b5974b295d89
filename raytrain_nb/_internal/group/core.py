"""The group core: the mutable parts of one worker group in one object, behind one lock.

Everything a group changes while it lives is here: its settings (``config``, which a rescale replaces), its
state and the observers told of every change, the slot table, the cell history, the values pushed from the
notebook, what a recovery carries over, and the metrics reported by the workers. The public
:class:`~raytrain_nb.WorkerGroup` is a facade over it; the parts that act on it (forming in
``formation.py``, running cells in ``execution.py``, the monitor, the dispatcher, snapshots, the recovery
executor) are handed the core when they are built, and use only its public members.

``lock`` guards the state and the slot marks (the monitor marks workers from its own thread). It is not
held while a cell runs: the one-cell-at-a-time rule is the runner's own (``execution.py``).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import logging
import threading
from typing import Any, Callable, Deque, Dict, Iterator, List, Optional, Sequence, Set, Tuple

from ..checkpoint.run_storage import RunStorage
from ..errors import GroupError
from .config import GroupConfig
from .fanout import collect
from .mirrors import UNSETTLED, Mirrors
from .rank_refresh import RankValues
from .slots import SlotTable
from .state import GroupState, SlotState, check_transition
from .steps import release_ranks
from .timing import DEFAULT_HEARTBEAT_TIMEOUT_S
from .types import CellRecord
from .vitals import Vitals

logger = logging.getLogger(__name__)

#: Reported metrics kept per rank for the dashboard's plot ...
METRICS_HISTORY = 10_000
#: ... and in all: a group of more than 50 ranks keeps fewer per rank (a record is ~0.5 KB on the driver: 10,000 per
#: rank would be 1.2 GB at 256 ranks, 4.6 GB at 1,000).
METRICS_HISTORY_TOTAL = 500_000


def history_cap(num_workers: int) -> int:
    """Records kept per rank in a group of ``num_workers``: ``METRICS_HISTORY``, at most its share of the total."""
    return max(1_000, min(METRICS_HISTORY, METRICS_HISTORY_TOTAL // max(1, num_workers)))

#: Plain names that differ by rank from the start (more are found as cells run).
RANK_SPECIFIC = frozenset({"rank", "local_rank", "world_rank", "ctx"})


@dataclasses.dataclass(frozen=True)
class Settings:
    """What a group was asked for, fixed for its life (``config`` is the core's: a rescale changes it)."""

    name: str
    cpus_asked: float  # the config's may be a share of the machine's (placement.share_cpus)
    start_timeout_s: float
    placement_timeout_s: Optional[float]
    num_spares: int
    address: Optional[str] = None
    storage_path: Optional[str] = None
    #: a Ray runtime environment for every worker actor (``RunConfig(worker_runtime_env=...)``)
    runtime_env: Optional[Dict[str, Any]] = None
    #: how long the group lives on without a driver (0: it ends with its kernel; ``custodian.py``)
    keep_alive_s: float = 0.0


class GroupCore:
    """One group's mutable parts: config, state, slots, history, pushed values, carried state and metrics.

    Args:
        config: the group's configuration (its kind is chosen from it once).
        settings: the fixed settings.
        run_storage: where the run's checkpoints live.
    """

    def __init__(self, config: GroupConfig, settings: Settings, run_storage: RunStorage) -> None:
        self.config = config
        self.kind = config.kind  # how it forms, carries state and recovers: chosen once (group/kinds.py)
        self.settings = settings
        self.run_storage = run_storage
        self.lock = threading.RLock()
        self.state = GroupState.STARTING
        self.slots = SlotTable()
        self.history: List[CellRecord] = []
        self.pushed: Dict[str, Any] = {}  # the latest value pushed under each name (new ranks get them too)
        self.rank_specific: Set[str] = set(RANK_SPECIFIC)
        self.background: Optional[Any] = None  # the latest BackgroundRun
        self.replay_failures: List[str] = []  # setup cells that failed when a new rank replayed them
        self.rank_values: Optional[RankValues] = None  # what the latest restart or rescale re-evaluated
        # (rank, state) handed over by a live rank before fresh processes replace every rank (TensorFlow), kept
        # until they have it: a renewal that failed leaves it for the next restart
        self.carried: Optional[Tuple[int, bytes]] = None
        self.last_recovery: Optional[Any] = None  # the latest recovery's RecoveryTimings (executor.py)
        self.heartbeat_s = DEFAULT_HEARTBEAT_TIMEOUT_S
        self.latest_metrics: Dict[int, Dict[str, Any]] = {}
        self.metrics_history: Dict[int, Deque[Dict[str, Any]]] = {}
        self.vitals = Vitals()  # each rank's resources, step time, and whether it is slow
        self.mirrors = Mirrors()  # where each rank's mirror of its shards is kept (a sharded group)
        self._observers: List[Callable[[GroupState, GroupState], None]] = []
        self._metric_observers: List[Callable[[Sequence[Dict[str, Any]]], None]] = []
        self._event_observers: List[Callable[[str, Dict[str, Any]], None]] = []
        self.trackers: Dict[str, Any] = {}  # kind -> the Tracker that group.track() attached (group/tracking.py)
        self._max_report_index = -1
        self._cell_seq = 0
        #: The id of the cell the driver has sent and waits for (an interrupt cancels it where it has not begun).
        self.running_cell: Optional[int] = None
        #: The last forming of the process group failed: the ranks hold none, and the next cell forms it first.
        self.unformed = False
        #: why this driver no longer drives the group ("" while it does): detached, or taken over (``survival.py``)
        self.taken_by = ""
        #: asks, before each command, whether another driver took the group over (a keep-alive group's custodian)
        self.owner_check: Callable[[], str] = lambda: ""

    @property
    def name(self) -> str:
        return self.settings.name

    @property
    def backend(self) -> str:
        return self.kind.torch_backend

    @property
    def num_workers(self) -> int:
        return len(self.slots)

    # -- state and observers ---------------------------------------------------------------

    def subscribe(self, callback: Callable[[GroupState, GroupState], None]) -> None:
        self._observers.append(callback)

    def subscribe_metrics(self, callback: Callable[[Sequence[Dict[str, Any]]], None]) -> None:
        self._metric_observers.append(callback)

    def subscribe_events(self, callback: Callable[[str, Dict[str, Any]], None]) -> None:
        """Call ``callback(kind, info)`` on an event that is not a state change (``rollback``, ``load``)."""
        self._event_observers.append(callback)

    def event(self, kind: str, **info: Any) -> None:
        """Tell event observers (a tracker records a rollback); an observer never breaks the group."""
        for cb in list(self._event_observers):
            try:
                cb(kind, info)
            except Exception:
                logger.exception("event observer failed")

    def transition(self, new: GroupState) -> None:
        """Change the state, checked against :data:`~.state.TRANSITIONS`, and tell observers.

        Raises:
            TransitionError: the table does not allow the change.
        """
        with self.lock:
            old = self.state
            check_transition(old, new)
            self.state = new
        if old is not new:
            self.notify(old)

    def notify(self, old: Optional[GroupState] = None) -> None:
        """Tell observers the group or a worker changed (``old is new`` for a worker-only change)."""
        for cb in list(self._observers):
            try:
                cb(old or self.state, self.state)
            except Exception:  # an observer never breaks the group
                logger.exception("state observer failed")

    def mark_dead(self, actor: Any, cause: str) -> None:
        """The worker process ``actor`` is gone: its rank turns dead and an idle group failed."""
        self._mark_gone(actor, SlotState.DEAD, cause)

    def mark_unresponsive(self, actor: Any, silent_s: float) -> None:
        """``actor`` has not answered a heartbeat for ``silent_s`` seconds."""
        self._mark_gone(actor, SlotState.UNRESPONSIVE, f"has not answered for {silent_s:.0f} s (stopped, e.g. "
                                                      "SIGSTOP, or blocked in C code holding the GIL)")

    def _mark_gone(self, actor: Any, state: SlotState, cause: str) -> None:
        with self.lock:
            rank = self.slots.rank_of(actor)
            if rank is None:
                return
            slot = self.slots[rank]
            if slot.state == SlotState.DEAD or (slot.gone and state == SlotState.UNRESPONSIVE):
                return
            slot.mark(state, cause)
            if state == SlotState.DEAD:
                logger.warning("rank %d (pid %s, node %s) died: %s", rank, slot.info.get("pid"),
                               slot.info.get("node_ip"), cause)
            else:
                logger.warning("rank %d (pid %s) %s", rank, slot.info.get("pid"), cause)
            if self.state is GroupState.IDLE:
                self.transition(GroupState.FAILED)
            else:
                self.notify()

    def check_not_running(self) -> None:
        """Raise unless the group can take a command now (driven from here, not shut down, no cell running)."""
        if self.taken_by or self.owner_check():
            raise GroupError(self.taken_by)
        if self.state is GroupState.SHUTDOWN:
            raise GroupError("this group was shut down: start a new one (a new %%distributed cell)")
        if self.state is GroupState.RUNNING:
            if self.background is not None and not self.background.done():
                raise GroupError("a background cell is running: %dist_wait waits for it, %dist_interrupt stops it "
                                 "(%dist_status, %dist_checkpoint, %dist_pull and %dist_interrupt work meanwhile)")
            raise GroupError("the group is running a cell: wait for it, or interrupt it")

    def check_usable(self) -> None:
        """:meth:`check_not_running`, every rank has joined the group, none is dead or silent, and its sharded
        models (if any) are sharded over its process group."""
        self.check_not_running()
        unjoined = [r for r, s in enumerate(self.slots) if not s.joined and not s.gone]
        if unjoined:
            raise GroupError(f"rank(s) {', '.join(map(str, unjoined))} never joined the group (a recovery failed "
                             "before they did) and hold none of its state: shut the group down and start a new one, "
                             "then roll back to a checkpoint")
        dead = self.slots.gone_ranks()
        if dead:
            raise GroupError(
                f"rank(s) {', '.join(map(str, dead))} are dead or not responding: %dist_restart (group.restart()) "
                "replaces them, %dist_rescale N (group.rescale(n)) continues without them"
            )
        if self.mirrors.unsettled:
            raise GroupError(f"{UNSETTLED}: {self.mirrors.unsettled}")

    # -- asking the ranks --------------------------------------------------------------------

    def collect(self, refs: List[Any], timeout: float, what: str, collective: bool = False) -> List[Any]:
        """Every rank's answer to ``refs`` (one call per slot of the group, in rank order, or of the workers
        being started) within ``timeout`` (saying what it waits for after 5 s). ``collective``: the calls meet in
        the process group's collectives (a sharded snapshot, a load, re-sharding), so once one rank died the others
        are released from them (their process group broken) instead of waiting for it until ``timeout``.

        Raises:
            WorkerDiedError: a worker died (naming its rank, pid, node and Ray's cause).
            GroupError: a rank did not answer in time, or raised; one line naming what.
        """
        slots = list(self.slots)

        def release(pending: List[int]) -> None:
            logger.warning("a rank died while the workers were to %s the group: rank(s) %s are released from its "
                           "collectives", what, ", ".join(str(i) for i in pending))
            release_ranks([slots[i] for i in pending if not slots[i].gone])

        return collect(refs, timeout, f"the workers to {what} the group", slots,
                       hint="raise start_timeout_s or check `ray status`",
                       on_death=release if collective and len(refs) == len(slots) else None)

    @contextlib.contextmanager
    def driver_cell(self, targets: List[int]) -> Iterator[List[Any]]:
        """Yields per target the framework backend's spec for this cell (its collective), or None each."""
        local = len({s.info.get("node_id") for s in self.slots}) == 1
        with self.kind.driver_cell(list(self.slots), targets, local) as specs:
            yield specs

    def continue_after(self, history: Sequence[CellRecord]) -> None:
        """Take over another driver's cell history (an attached group): new cells are numbered after it."""
        self.history[:] = list(history)
        self._cell_seq = max([self._cell_seq] + [r.cell_id for r in history])

    def next_cell_id(self) -> int:
        self._cell_seq += 1
        return self._cell_seq

    # -- metrics -------------------------------------------------------------------------------

    def record_metrics(self, records: Sequence[Dict[str, Any]]) -> None:
        """Keep reported metrics per rank: the latest and a capped history; log and commit checkpoints."""
        for rec in records:
            name = rec.get("report")
            if name:
                self._max_report_index = max(self._max_report_index, int(name.rsplit("_", 1)[1]))
        if records:
            self.run_storage.on_records(records, self.num_workers)
        for rec in records:
            rank = rec["rank"]
            self.latest_metrics[rank] = rec["metrics"]
            history = self.metrics_history.get(rank)
            if history is None:
                history = self.metrics_history[rank] = collections.deque(maxlen=history_cap(self.num_workers))
            history.append(rec)
        if self.vitals.on_reports(records):  # a rank turned slow or caught up: its row changes
            self.notify()
        for cb in list(self._metric_observers):
            try:
                cb(records)
            except Exception:
                logger.exception("metrics observer failed")

    def reports_seen(self, base: int) -> int:
        """How many reports the last cell made (numbered from ``base``), from what reached the driver."""
        return self._max_report_index - base + 1 if self._max_report_index >= base else 0
