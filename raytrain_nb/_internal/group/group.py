"""WorkerGroup: a persistent group of Ray actors that runs cells and functions.

The magics and the dashboard are thin layers over the public methods here;
everything a user can click can be scripted. Starting workers and forming the
process group live in :mod:`.formation`, running code in :mod:`.execution`,
recovery in :mod:`.recovery`, snapshots in :mod:`.snapshots`; the state machine in
:mod:`.state` and the slot table in :mod:`.slots`.
"""
from __future__ import annotations

import logging
import secrets
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence, Tuple

from .. import cluster, frontend
from ..checkpoint.run_storage import RunStorage
from ..errors import GroupError
from ..worker.checkpointing import read_storage_marker
from .config import GroupConfig
from .execution import ExecutionMixin
from .formation import FormationMixin
from .liveness import LivenessMixin
from .monitor import HealthMonitor
from .placement import reserve, share_cpus
from .rank_refresh import RankValues
from .recovery import replace_ranks, rescale, restart
from .slots import SlotTable
from .snapshots import RollbackResult, checkpoint, load, rollback, wait_background
from .state import GroupState, SlotState, check_transition
from .timing import CONTROL_CALL_S, CONTROL_START_S, DEFAULT_HEARTBEAT_TIMEOUT_S
from .types import CellRecord

logger = logging.getLogger(__name__)


_ACTIVE: Optional["WorkerGroup"] = None


def active_group() -> Optional["WorkerGroup"]:
    """The group the magics use (the latest one started and not shut down), or None."""
    return _ACTIVE


class WorkerGroup(FormationMixin, ExecutionMixin, LivenessMixin):
    """N Ray actors, one per rank, with a persistent namespace each and a process group.

    Args:
        num_workers: number of ranks.
        cpus_per_worker: CPUs reserved per worker.
        gpus_per_worker: GPUs per worker (each rank gets its own).
        resources_per_worker: extra custom Ray resources per worker.
        placement_strategy: ``PACK`` (default) or ``SPREAD`` (and the STRICT_ forms).
        backend: ``gloo``, ``nccl`` or ``none``; default nccl with GPUs, gloo without.
        address: a Ray cluster address; default ``RAY_ADDRESS`` or an embedded instance.
        name: a readable name for the run.
        placement_timeout_s: how long to wait for resources before failing.
        heartbeat_timeout_s: a worker silent this long is reported unresponsive.
        spares: standby workers kept started (torch imported) to replace a dead rank quickly.
        storage_path: where runs are kept (any fsspec URL shared by all workers); default
            ``RAYTRAIN_NB_STORAGE_PATH`` or ``~/raytrain_nb_results``. The run directory is
            ``<storage_path>/<name>``.
        num_to_keep, checkpoint_score_attribute, checkpoint_score_order: how many reported
            checkpoints to keep, ranked by which metric (snapshots are always kept).

    Raises:
        GroupError: bad arguments; ResourceError: the cluster cannot place the group.

    Example:
        >>> group = WorkerGroup(2)                   # doctest: +SKIP
        >>> group.run("x = get_context().get_world_rank()")  # doctest: +SKIP
        >>> group.pull("x", rank=None)               # doctest: +SKIP
        [0, 1]
    """

    def __init__(self, num_workers: int = 2, *, cpus_per_worker: float = 1, gpus_per_worker: float = 0,
                 resources_per_worker: Optional[Dict[str, float]] = None, placement_strategy: str = "PACK",
                 backend: Optional[str] = None, address: Optional[str] = None, name: Optional[str] = None,
                 placement_timeout_s: Optional[float] = 10.0, start_timeout_s: float = 180.0,
                 heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S, spares: int = 0,
                 storage_path: Optional[str] = None, num_to_keep: Optional[int] = None,
                 checkpoint_score_attribute: Optional[str] = None, checkpoint_score_order: str = "max",
                 activate: bool = True) -> None:
        global _ACTIVE
        self.config = GroupConfig(num_workers=num_workers, cpus_per_worker=cpus_per_worker,
                                  gpus_per_worker=gpus_per_worker, resources_per_worker=resources_per_worker,
                                  placement_strategy=placement_strategy, backend=backend)
        self.cpus_asked = float(cpus_per_worker)  # config's may be a share of the machine's (share_cpus)
        self.kind = self.config.kind  # how it forms, carries state and recovers: chosen once (group/kinds.py)
        self.backend = self.kind.torch_backend
        self.address = address
        self.name = name or f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"  # unique per writer
        self.start_timeout_s = start_timeout_s
        self.state = GroupState.STARTING
        self._observers: List[Callable[[GroupState, GroupState], None]] = []
        self._metric_observers: List[Callable[[Sequence[Dict[str, Any]]], None]] = []
        self._lock = threading.RLock()
        self._state_lock = threading.RLock()
        self.slots = SlotTable()
        self.history: List[CellRecord] = []
        self.pushed: Dict[str, Any] = {}  # the latest value pushed under each name (new ranks get them too)
        self._max_report_index = -1
        self.background: Optional[Any] = None  # the latest BackgroundRun
        self.replay_failures: List[str] = []  # setup cells that failed when a new rank replayed them
        self.rank_values: Optional[RankValues] = None  # what the latest restart or rescale re-evaluated
        # (rank, state) handed over by a live rank before fresh processes replace every rank (TensorFlow), kept
        # until they have it: a renewal that failed leaves it for the next restart
        self.carried: Optional[Tuple[int, bytes]] = None
        self.rank_specific: set = {"rank", "local_rank", "world_rank", "ctx"}  # plain names that differ by rank
        self._cell_seq = 0
        self.latest_metrics: Dict[int, Dict[str, Any]] = {}
        self.metrics_history: Dict[int, Deque[Dict[str, Any]]] = {}
        self.storage_path = storage_path
        self.num_spares = spares
        if isinstance(spares, bool) or not isinstance(spares, int) or spares < 0:
            raise GroupError(f"spares={spares!r} is not allowed: give a whole number, 0 or more (--spares 1)")
        self.placement_timeout_s = placement_timeout_s
        self.run_storage = RunStorage(storage_path, self.name, num_to_keep, checkpoint_score_attribute,
                                      checkpoint_score_order, owner=f"group {self.name!r}")
        try:
            cluster.connect(address)
            self.config = share_cpus(self.config, num_workers + spares)  # more than the machine has: shared
            self.slots.pgs.append(reserve(self.config, num_workers + spares, placement_timeout_s))
        except BaseException:
            self.run_storage.close()
            raise
        pg = self.slots.pgs[0]
        try:
            self.slots.spares = [self._spawn(pg, i) for i in range(num_workers, num_workers + spares)]
            for spare in self.slots.spares:
                spare.actor.warm.remote()
            self.slots.assign(self._order([self._spawn(pg, i) for i in range(num_workers)]))
            self._rendezvous("setup")
            self._get([s.actor.set_storage.remote(self.run_storage.url) for s in self.slots], CONTROL_START_S, "start")
            self.run_storage.check_shared(lambda url, token: self.execute(read_storage_marker, url, token),
                                          num_workers)
        except BaseException:
            self._teardown()
            raise
        self.transition(GroupState.IDLE)
        self._monitor = HealthMonitor(self, heartbeat_timeout_s=heartbeat_timeout_s)
        if activate:
            _ACTIVE = self
        logger.info("group %s: %d workers ready", self.name, num_workers)

    # -- observers and state -------------------------------------------------------------

    def subscribe(self, callback: Callable[[GroupState, GroupState], None]) -> None:
        """Call ``callback(old, new)`` on every state change."""
        self._observers.append(callback)

    def subscribe_metrics(self, callback: Callable[[Sequence[Dict[str, Any]]], None]) -> None:
        """Call ``callback(records)`` whenever reported metrics arrive from workers."""
        self._metric_observers.append(callback)

    def transition(self, new: GroupState) -> None:
        """Change the group's state, checked against :data:`~.state.TRANSITIONS`, and tell observers.

        Raises:
            TransitionError: the table does not allow the change.
        """
        with self._state_lock:
            old = self.state
            check_transition(old, new)
            self.state = new
        if old is not new:
            self._notify(old)

    def _notify(self, old: Optional[GroupState] = None) -> None:
        """Tell observers the group or a worker changed (``old is new`` for a worker-only change)."""
        for cb in list(self._observers):
            try:
                cb(old or self.state, self.state)
            except Exception:  # an observer never breaks the group
                logger.exception("state observer failed")

    @property
    def num_workers(self) -> int:
        return len(self.slots)

    def _check_not_running(self) -> None:
        if self.state is GroupState.SHUTDOWN:
            raise GroupError("this group was shut down: start a new one (a new %%distributed cell)")
        if self.state is GroupState.RUNNING:
            if self.background is not None and not self.background.done():
                raise GroupError("a background cell is running: %dist_wait waits for it, %dist_interrupt stops it "
                                 "(%dist_status, %dist_checkpoint, %dist_pull and %dist_interrupt work meanwhile)")
            raise GroupError("the group is running a cell: wait for it, or interrupt it")

    def _check_usable(self) -> None:
        self._check_not_running()
        dead = self.slots.gone_ranks()
        if dead:
            raise GroupError(
                f"rank(s) {', '.join(map(str, dead))} are dead or not responding: %dist_restart (group.restart()) "
                "replaces them, %dist_rescale N (group.rescale(n)) continues without them"
            )

    # -- looking and controlling (liveness, status and interrupts: :mod:`.liveness`) ------

    def dashboard(self, **options: Any) -> Any:
        """This group's live dashboard (one per group): per-rank progress, a metrics plot, the
        checkpoint list and the recovery buttons. Shown when it is a cell's value.

        The widgets live in the notebook layer, which registers them with the core
        (:mod:`~raytrain_nb._internal.frontend`), so the core never imports IPython or ipywidgets.
        ``options`` go to the dashboard the first time (e.g. ``plot_interval_s``).
        """
        return frontend.dashboard(self, **options)

    def replace(self, ranks: Sequence[int]) -> None:
        """Replace the workers of ``ranks`` with fresh ones that get a live peer's state."""
        replace_ranks(self, list(ranks))

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint(self, name: Optional[str] = None, vars: Sequence[str] = (), *, blocking: bool = True,
                   timeout_s: float = 60.0) -> Any:
        """Snapshot the warm state of every rank (models, optimizers, schedulers, grad scalers, RNG
        states, and the plain variables named in ``vars``).

        Between cells it is taken at once; while a cell runs (from another thread, a background
        cell, the dashboard), at the next ``report()`` on every rank, or fails after ``timeout_s``.
        With ``blocking=False`` the state is copied in memory, then written in the background.

        Returns:
            The committed :class:`CheckpointEntry` (None when ``blocking=False``).

        Raises:
            SnapshotError: e.g. an optimizer whose model is not bound to a name.
        """
        return checkpoint(self, name, list(vars), blocking, timeout_s)

    def rollback(self, name_or_index: Any = "latest", *, run: Optional[str] = None,
                 allow_pickle: bool = False) -> RollbackResult:
        """Load a snapshot into the same objects on every rank (``id()`` unchanged).

        Args:
            name_or_index: a snapshot name, an index into :meth:`checkpoints`, or ``"latest"``.
            run: another run (in the same storage) to take it from, e.g. from an earlier kernel.
            allow_pickle: allow unpickling the saved ``vars`` that are not plain data.

        Returns:
            A :class:`RollbackResult` listing what was restored and the plain variables,
            not restored, that changed since the snapshot.
        """
        return rollback(self, name_or_index, run, allow_pickle)

    def load(self, checkpoint: Any, *, allow_pickle: bool = False) -> RollbackResult:
        """Load a checkpoint of named state into the same named objects on every rank (``id()`` unchanged).

        The checkpoint is a snapshot (of any run) or one a trial wrote with
        ``raytrain_nb.tune.save_state(dir, model=model, opt=opt)``: each saved name (``model``,
        ``opt``) loads into the object bound to that name here, as rollback does.

        Args:
            checkpoint: a path or fsspec URL, a ``Checkpoint``, or a result holding one (Ray
                Tune's ``ResultGrid.get_best_result()``, ``trainer.fit()``'s).
            allow_pickle: allow unpickling a snapshot's saved ``vars`` that are not plain data.

        Raises:
            CheckpointError: not a checkpoint of named state, or damaged; GroupError: a saved name
                is missing here or its shape differs (nothing is loaded then).

        Example:
            >>> group.load(results.get_best_result())   # doctest: +SKIP
            loaded /runs/trial_1/checkpoint_000003: restored model, opt
        """
        return load(self, checkpoint, allow_pickle)

    def attach_datasets(self, **datasets: Any) -> None:
        """Split Ray Data datasets across the ranks; ``get_dataset_shard(name)`` returns each rank's part.

        Each dataset is split with ``streaming_split(num_workers, equal=True)``, and split again
        after a restart or rescale. Example: ``group.attach_datasets(train=ray.data.range(1000))``.
        """
        from .datasets import attach  # ray.data: loaded only when datasets are attached

        attach(self, datasets)

    def checkpoints(self, kind: Optional[str] = None) -> List[Any]:
        """The run's checkpoints (``kind``: ``"snapshot"``, ``"reported"`` or all), oldest first."""
        wait_background(self)
        return self.run_storage.manager.list(kind)

    def delete_checkpoint(self, name: str) -> None:
        """Delete a checkpoint (snapshots are only ever deleted this way)."""
        self.run_storage.manager.delete(name)

    # -- recovery --------------------------------------------------------------------------

    def restart(self, from_checkpoint: Optional[Any] = None) -> List[int]:
        """Replace every dead (or unresponsive) worker; state comes from a live peer.

        Each replacement replays the group's setup cells (collectives deferred),
        then every rank re-forms the process group, DDP models are re-wrapped
        and the replicated state (models, optimizers, schedulers, grad scalers,
        plain variables the replacement lacks) is broadcast from a survivor.

        With ``from_checkpoint`` (a snapshot name, or ``"latest"``) every rank then loads
        that snapshot instead; then no live worker is needed (every rank may have died).

        On a backend that cannot form its collective again in a live process (``tensorflow``) every
        rank gets a fresh process: the lowest live rank hands over its tracked state (models,
        optimizers, Keras models, boosters), every new rank replays the setup cells inside the
        backend, and the state is loaded into the objects the cells made again.

        Then every rank runs again the notebook's assignments of its own rank values (``rank =
        get_context().get_world_rank()``, ``world_size``, ``os.environ["RANK"]``...); :attr:`rank_values`
        (a ``RankValues``) names them, and the names computed from them that were not re-evaluated.

        Returns:
            The ranks replaced.

        Raises:
            GroupError: no dead worker, or no live worker to copy state from (and no ``from_checkpoint``).
        """
        self.run_storage.recover()
        replaced = restart(self, from_checkpoint is not None)
        if from_checkpoint is not None:
            self.rollback(from_checkpoint)
        return replaced

    def rescale(self, num_workers: int) -> None:
        """Grow or shrink the group to ``num_workers``, keeping the warm state.

        Dead workers are dropped first; new ranks replay the setup cells and get
        a live peer's state; the process group is re-formed at the new size,
        DDP models re-wrapped and ``prepare_data_loader`` samplers re-sharded. On a backend that
        needs fresh processes (``tensorflow``) every rank is new, as in :meth:`restart`. Rank values
        (``rank``, ``world_size``...) are re-evaluated on every rank, as in :meth:`restart` (:attr:`rank_values`).

        Raises:
            GroupError / ResourceError: a bad size, or not enough resources (names the numbers).
        """
        self.run_storage.recover()
        rescale(self, num_workers)

    def shutdown(self) -> None:
        """Stop every worker and free the resources (the Ray instance stays up)."""
        global _ACTIVE
        if self.state is GroupState.SHUTDOWN:
            return
        if getattr(self, "_monitor", None) is not None:
            self._monitor.stop()
        self._teardown()
        self.transition(GroupState.SHUTDOWN)
        if _ACTIVE is self:
            _ACTIVE = None

    def _teardown(self) -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb
        # ray: loaded when a group or trainer runs, not on import raytrain_nb
        from ray.util.placement_group import remove_placement_group

        live = [s for s in self.slots if s.state != SlotState.DEAD]
        if live:
            ray.wait([s.actor.shutdown_backend.remote() for s in live], num_returns=len(live), timeout=CONTROL_CALL_S)
        for s in self.slots.everyone():
            try:
                ray.kill(s.actor, no_restart=True)
            except Exception as exc:  # noqa: BLE001 - already gone is fine; anything else is said
                if not isinstance(exc, ray.exceptions.RayActorError):
                    logger.warning("could not stop the worker of pid %s: %s", s.info.get("pid"), exc)
        for pg in self.slots.pgs:
            try:
                remove_placement_group(pg)
            except Exception as exc:  # noqa: BLE001 - teardown goes on, and says what it left
                logger.warning("could not release placement group %s: %s", pg.id.hex(), exc)
        self.run_storage.close()

    def __repr__(self) -> str:
        return f"WorkerGroup(name={self.name!r}, workers={self.num_workers}, backend={self.backend!r}, state={self.state.value!r})"
