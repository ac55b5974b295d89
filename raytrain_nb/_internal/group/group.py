"""WorkerGroup: a persistent group of Ray actors that runs cells and functions.

The magics and the dashboard are thin layers over the public methods here; everything a user can click can
be scripted. ``WorkerGroup`` is a facade: the group's mutable parts live in one private core (``core.py``), and
each job is one part acting on it: forming the group (``formation.py``), running code (``execution.py``),
liveness (``liveness.py``), recovery (``recovery.py``: a plan, carried out by ``executor.py``), snapshots
(``snapshots.py``), looking inside (``whereabouts.py``, ``debug.py``). Nothing outside reaches into the core.
"""
from __future__ import annotations

import logging
import operator
import secrets
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from .. import frontend
from ..durations import parse_duration
from ..checkpoint.run_storage import RunStorage
from ..errors import GroupError
from ..output import OutputSink, TextSink
from ..worker.checkpointing import read_storage_marker
from . import liveness, tracking, validations
from .active import active_group, leave, make_active
from .attach import adopt, alive_groups, claim
from .config import GroupConfig
from .core import GroupCore, Settings
from .debug import post_mortem
from .execution import Runner
from .formation import Formation
from .monitor import HealthMonitor
from .recovery import replace_ranks, rescale, restart
from .retiring import teardown
from .snapshots import RollbackResult, checkpoint, load, rollback, wait_background
from .state import GroupState
from .survival import Survival, detach
from .timing import CONTROL_CALL_S, DEFAULT_HEARTBEAT_TIMEOUT_S
from .types import WorkerStatus
from .whereabouts import Whereabouts, where

logger = logging.getLogger(__name__)


def _read(path: str, doc: str, copy: Callable[[Any], Any] = lambda value: value) -> property:
    """A read-only property of the group: ``path`` (dotted) read off its core, through ``copy``."""
    get = operator.attrgetter(path)
    return property(lambda self: copy(get(self._core)), doc=doc)


class WorkerGroup:
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
            ``RAYTRAIN_NB_STORAGE_PATH`` or ``~/raytrain_nb_results``. The run directory is ``<storage_path>/<name>``.
        num_to_keep, checkpoint_score_attribute, checkpoint_score_order: how many reported checkpoints to keep,
            ranked by which metric (snapshots are always kept).
        runtime_env: a Ray runtime environment for every worker actor, e.g. ``{"env_vars": {...}}``.
        keep_alive: how long the group outlives its kernel (seconds, or ``"30m"``); 0 (default): it ends with it.

    Raises GroupError: bad arguments; ResourceError: the cluster cannot place the group.

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
                 activate: bool = True, runtime_env: Optional[Dict[str, Any]] = None, keep_alive: Any = 0) -> None:
        if isinstance(spares, bool) or not isinstance(spares, int) or spares < 0:
            raise GroupError(f"spares={spares!r} is not allowed: give a whole number, 0 or more (--spares 1)")
        config = GroupConfig(num_workers=num_workers, cpus_per_worker=cpus_per_worker,
                             gpus_per_worker=gpus_per_worker, resources_per_worker=resources_per_worker,
                             placement_strategy=placement_strategy, backend=backend)
        name = name or f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"  # unique per writer
        settings = Settings(name=name, cpus_asked=float(cpus_per_worker), start_timeout_s=start_timeout_s,
                            placement_timeout_s=placement_timeout_s, num_spares=spares, address=address,
                            storage_path=storage_path, runtime_env=dict(runtime_env) if runtime_env else None,
                            keep_alive_s=parse_duration(keep_alive))
        storage = RunStorage(storage_path, name, num_to_keep, checkpoint_score_attribute, checkpoint_score_order,
                             owner=f"group {name!r}")
        self._assemble(GroupCore(config, settings, storage), heartbeat_timeout_s, activate, None)
        logger.info("group %s: %d workers ready", name, num_workers)

    def _assemble(self, core: GroupCore, heartbeat_s: float, activate: bool, claimed: Optional[tuple]) -> None:
        self._core, self._monitor, self._survival = core, None, None  # claimed: (custodian, owner) of an attach
        self._formation = Formation(core)
        self._runner = Runner(core, self._formation, self)
        if claimed is None:
            self._formation.start(lambda url, token: self.execute(read_storage_marker, url, token))
            core.transition(GroupState.IDLE)
        if core.settings.keep_alive_s > 0:
            self._survival = Survival.start(core, claimed)
        self._monitor = HealthMonitor(core, heartbeat_timeout_s=heartbeat_s)
        core.heartbeat_s = heartbeat_s  # formations from now on judge a silent rank by it too
        if activate:
            make_active(self)

    @classmethod
    def attach(cls, run: Optional[str] = None, *, steal: bool = False, address: Optional[str] = None,
               heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S, sink: Optional[OutputSink] = None
               ) -> "WorkerGroup":
        """Take over a keep-alive group that outlived its kernel (``%dist_attach``; the only one alive unless ``run``
        names one); GroupError while its owner kernel is alive unless ``steal``. It becomes the active group."""
        core, custodian, owner, note = claim(run, steal, address)
        self = cls.__new__(cls)  # built from the claimed core, not formed: __init__ would start new workers
        self._assemble(core, heartbeat_timeout_s, True, (custodian, owner))
        self.attach_note = adopt(self, core, sink, note)  # a cell still running there goes on as a background one
        return self

    alive_groups = staticmethod(alive_groups)  # every keep-alive group alive here (``%dist_groups``)

    def detach(self, keep_alive: Any = None) -> float:
        """Leave this keep-alive group to live on without this kernel for ``keep_alive`` (default: its own) until a
        kernel attaches it (``%dist_detach``); returns those seconds. Raises GroupError for a group without one."""
        return detach(self, self._core, self._survival, self._monitor, keep_alive)

    # -- what the group is (read-only: the group's own parts change it) ---------------------

    state = _read("state", "The group's :class:`GroupState` (``group.state == \"idle\"`` holds too).")
    name = _read("name", "The run's name (its directory under the storage path).")
    config = _read("config", "The group's :class:`GroupConfig` (a rescale changes ``num_workers``).")
    kind = _read("kind", "How the group forms, carries state and recovers (a ``GroupKind``, chosen once).")
    backend = _read("backend", "The torch process group's backend (``gloo``, ``nccl``) or the framework's name.")
    num_workers = _read("num_workers", "How many ranks the group has now.")
    address = _read("settings.address", "The Ray cluster address the group was started on (None: local).")
    storage_path = _read("settings.storage_path", "Where runs are kept, as given (None: the default).")
    num_spares = _read("settings.num_spares", "How many standby workers the group keeps.")
    keep_alive = _read("settings.keep_alive_s", "Seconds the group lives on without a driver (0: it ends with it).")
    run_storage = _read("run_storage", "Where the run's checkpoints live (``.url``, ``.manager``).")
    background = _read("background", "The latest ``--background`` cell (a ``BackgroundRun``), or None.")
    last_recovery = _read("last_recovery", "Where the seconds of the latest restart or rescale went (a "
                                           "``RecoveryTimings``: each step of its plan), or None.")
    rank_values = _read("rank_values", "What the latest restart or rescale re-evaluated on every rank (a "
                                       ":class:`RankValues`: ``rank``, ``world_size``...), or None.")

    slots = _read("slots", "The workers of ranks 0..n-1 (actor, ``info`` with pid and node, state), in rank order.",
                  tuple)
    free_places = _read("slots.free", "Places (placement group, bundle) reserved for the group, not in use.", tuple)
    history = _read("history", "The cells the group ran on every rank, oldest first.", tuple)
    replay_failures = _read("replay_failures", "Lines about what new ranks could not rebuild (a setup cell that "
                                               "failed, a name not copied).", tuple)

    def take_replay_failures(self) -> List[str]:
        """:attr:`replay_failures`, then forget them (the magics say each once)."""
        lines, self._core.replay_failures[:] = list(self._core.replay_failures), []
        return lines

    @property
    def latest_metrics(self) -> Dict[int, Dict[str, Any]]:
        """The latest metrics each rank reported (a copy)."""
        return {rank: dict(m) for rank, m in self._core.latest_metrics.items()}

    @property
    def metrics_history(self) -> Dict[int, List[Dict[str, Any]]]:
        """Every rank's reported metrics, oldest first (up to the last 10,000 per rank; a copy)."""
        return {rank: list(records) for rank, records in self._core.metrics_history.items()}

    def subscribe(self, callback: Callable[[GroupState, GroupState], None]) -> None:
        """Call ``callback(old, new)`` on every state change."""
        self._core.subscribe(callback)

    def subscribe_metrics(self, callback: Callable[[Sequence[Dict[str, Any]]], None]) -> None:
        """Call ``callback(records)`` whenever reported metrics arrive from workers."""
        self._core.subscribe_metrics(callback)

    # -- running code (:mod:`.execution`) ---------------------------------------------------

    def run(self, source: str, ranks: Optional[Sequence[int]] = None, *, output: str = "rank0",
            sink: Optional[OutputSink] = None, setup: Optional[bool] = None, on_failure: str = "raise",
            max_failures: int = 1, background: bool = False, quiet_after_s: float = 0.0,
            prompt: Optional[Callable[[str], str]] = None) -> Any:
        """Run cell source in each worker's persistent namespace (IPython semantics). Output streams to ``sink``
        while the cell runs; the value of a trailing expression is rendered on the worker and passed to ``sink.value``.

        Args:
            source: the cell's code.
            ranks: the ranks to run on (default: all).
            output: ``rank0`` (the lowest targeted rank), ``all`` (labelled) or ``none``.
            sink: where output goes (default: this process's stdout/stderr).
            setup: whether a new rank must replay this cell to rebuild its namespace; by default, cells that
                neither called ``report()`` nor ran a prepared model.
            on_failure: when a worker dies: ``raise`` (default), ``restart`` (replace it, state from a live peer) or
                ``rescale`` (continue with the survivors); then the cell runs again, at most ``max_failures`` times.
            background: return at once a :class:`BackgroundRun` (``.wait()`` for the result); output keeps going to
                ``sink``; status, checkpoint, interrupt and pull work meanwhile.
            quiet_after_s: a cell with no output and no report this long says once where every rank is
                (:meth:`where`); 0 never (``%%distributed`` says 60).
            prompt: reads a line for a ``breakpoint()`` in the cell (e.g. ``input``); None refuses it in one line.

        Returns a :class:`CellResult`; raises WorkerError: the cell raised on some ranks (merged, shown as the cell's
        traceback).
        """
        return self._runner.run(source, ranks, output=output, sink=sink, setup=setup, on_failure=on_failure,
                                max_failures=max_failures, background=background, quiet_after_s=quiet_after_s,
                                prompt=prompt)

    def execute(self, fn: Callable[..., Any], *args: Any, ranks: Optional[Sequence[int]] = None,
                sink: Optional[OutputSink] = None, output: str = "rank0", **kwargs: Any) -> List[Any]:
        """Call ``fn(*args, **kwargs)`` on each targeted worker; return per-rank results in rank order.

        ``output``: whose output reaches ``sink``: ``rank0`` (default), ``all`` (labelled) or ``none``.
        """
        return self._runner.execute(fn, *args, ranks=ranks, sink=sink, output=output, **kwargs)

    def push(self, **values: Any) -> None:
        """Bind ``values`` in every worker's namespace (new ranks get them too); GroupError: a value cannot be
        pickled (names the variable)."""
        self._runner.push(**values)

    def pull(self, name: str, rank: Optional[int] = 0) -> Any:
        """A variable from one rank (default 0) or, with ``rank=None``, a list from every rank. DDP models come
        back unwrapped and tensors on the CPU. Raises GroupError: the name is not defined on a rank, or a rank is
        dead or did not answer within ``timing.PULL_S`` (every rank is asked at once: a stopped one costs one deadline).
        """
        return self._runner.pull(name, rank)

    def reload(self, module: str) -> List[str]:
        """Re-import ``module`` on every rank (after editing it); returns its file per rank."""
        return self._runner.reload(module)

    # -- looking and controlling (:mod:`.liveness`) -------------------------------------------

    def status(self, ping: bool = True) -> List[WorkerStatus]:
        """One :class:`WorkerStatus` per rank (state, resources, step time, slow); dead workers show as ``dead``.

        ``ping``: ask every live worker first, all at once (up to ``timing.PING_S``), so a death Ray knows of
        counts; ``False`` answers at once from what the group already knows (observers, the dashboard).
        """
        return liveness.status(self._core, ping)

    def interrupt(self) -> List[Dict[str, Any]]:
        """Interrupt the running code on every rank (KeyboardInterrupt in user code), every live rank asked at
        once under one deadline (``timing.INTERRUPT_CALL_S``): a rank that did not answer is ``unreachable``."""
        return liveness.interrupt(self._core)

    def where(self) -> Whereabouts:
        """Where every rank's running code is now (``%dist_where``), every rank asked at once (``timing.WHERE_S``):
        ``str()`` groups ranks with the same stack (``ranks 0, 2: in all_reduce for 61 s (cell 5, line 4)``)."""
        return where(self._core)

    def debug(self, rank: Optional[int] = None, prompt: Optional[Callable[[str], str]] = None,
              sink: Optional[OutputSink] = None) -> str:
        """pdb post-mortem on ``rank``'s last failure (default: the lowest failed rank) on its cell thread
        (``%dist_debug``): lines read with ``prompt`` (default ``input``), pdb's output to ``sink``; ``q`` ends it."""
        return post_mortem(self._core, rank, prompt, sink or TextSink())

    def dashboard(self, **options: Any) -> Any:
        """This group's live dashboard (one per group): per-rank progress, a metrics plot, the checkpoint list and
        the recovery buttons; shown when it is a cell's value. The widgets live in the notebook layer, registered
        with the core (``frontend.py``); ``options`` go to it the first time (e.g. ``plot_interval_s``).
        """
        return frontend.dashboard(self, **options)

    def replace(self, ranks: Sequence[int]) -> None:
        """Replace the workers of ``ranks`` with fresh ones that get a live peer's state."""
        replace_ranks(self._core, self._formation, list(ranks))

    def track(self, tracker: Any = "mlflow", **options: Any) -> Any:
        """Log this group's reports, pushed values and rollbacks to its run's tracked run (:func:`.tracking.track`)."""
        return tracking.track(self._core, tracker, options)

    def validation(self, fn: Any, task_config: Any = None, ray_remote_kwargs: Any = None) -> None:
        """Validate what cells report with ``validation=True`` by ``fn`` or a ``ValidationConfig`` (validations.py)."""
        validations.attach_to_group(self._core, fn, task_config, ray_remote_kwargs)

    # -- checkpoints -----------------------------------------------------------------------

    def checkpoint(self, name: Optional[str] = None, vars: Sequence[str] = (), *, blocking: bool = True,
                   timeout_s: float = 60.0) -> Any:
        """Snapshot the warm state of every rank (models, optimizers, schedulers, grad scalers, RNG states, and the
        plain variables named in ``vars``). Between cells it is taken at once; while a cell runs (from another
        thread, a background cell, the dashboard), at the next ``report()`` on every rank, or fails after
        ``timeout_s``. With ``blocking=False`` the state is copied in memory, then written in the background.

        Returns the committed :class:`CheckpointEntry` (None when ``blocking=False``); raises ``SnapshotError``
        (e.g. an optimizer whose model is not bound to a name).
        """
        return checkpoint(self._core, name, list(vars), blocking, timeout_s)

    def mirror_shards(self, on: bool = True, every: int = 0) -> Optional[str]:
        """Keep (``every``: also every that many reports) or drop each rank's FSDP2 shards in a buddy; its cost."""
        return self._core.mirrors.turn(self._core, on, every)

    def rollback(self, name_or_index: Any = "latest", *, run: Optional[str] = None,
                 allow_pickle: bool = False) -> RollbackResult:
        """Load a snapshot into the same objects on every rank (``id()`` unchanged).

        Args:
            name_or_index: a snapshot name, an index into :meth:`checkpoints`, or ``"latest"``.
            run: another run (in the same storage) to take it from, e.g. from an earlier kernel.
            allow_pickle: allow unpickling the saved ``vars`` that are not plain data.

        Returns a :class:`RollbackResult` listing what was restored and the plain variables, not restored, that
        changed since the snapshot.
        """
        return rollback(self._core, name_or_index, run, allow_pickle)

    def load(self, checkpoint: Any, *, allow_pickle: bool = False) -> RollbackResult:
        """Load a checkpoint of named state into the same named objects on every rank (``id()`` unchanged).

        The checkpoint is a snapshot (of any run) or one a trial wrote with ``raytrain_nb.tune.save_state(dir, model=
        model, opt=opt)``: each saved name (``model``, ``opt``) loads into the object bound to it, as rollback does.

        Args:
            checkpoint: a path or fsspec URL, a ``Checkpoint``, or a result holding one (Ray Tune's
                ``ResultGrid.get_best_result()``, ``trainer.fit()``'s).
            allow_pickle: allow unpickling a snapshot's saved ``vars`` that are not plain data.

        Raises CheckpointError: not a checkpoint of named state, or damaged; GroupError: a saved name is missing
        here or its shape differs (nothing is loaded then).
        """
        return load(self._core, checkpoint, allow_pickle)

    def attach_datasets(self, **datasets: Any) -> None:
        """Split Ray Data datasets across the ranks (``streaming_split(num_workers, equal=True)``, again after a
        restart or rescale); ``get_dataset_shard(name)`` returns each rank's part: ``group.attach_datasets(train=ds)``.
        """
        from .datasets import attach  # ray.data: loaded only when datasets are attached

        attach(self, datasets)

    def checkpoints(self, kind: Optional[str] = None) -> List[Any]:
        """The run's checkpoints (``kind``: ``"snapshot"``, ``"reported"`` or all), oldest first."""
        wait_background(self._core)
        return self.run_storage.manager.list(kind)

    def delete_checkpoint(self, name: str) -> None:
        """Delete a checkpoint (snapshots are only ever deleted this way)."""
        self.run_storage.manager.delete(name)

    # -- recovery --------------------------------------------------------------------------

    def restart(self, from_checkpoint: Optional[Any] = None) -> List[int]:
        """Replace every dead (or unresponsive) worker; state comes from a live peer. Returns the ranks replaced.

        Each replacement replays the group's setup cells (collectives deferred), then every rank re-forms the process
        group, DDP models are re-wrapped and the replicated state (models, optimizers, schedulers, grad scalers, plain
        variables the replacement lacks) is broadcast from a survivor. With ``from_checkpoint`` (a snapshot name, or
        ``"latest"``) every rank then loads that snapshot instead; no live worker is needed then (all may have died).
        On a backend that cannot form its collective again in a live process (``tensorflow``) every rank gets a
        fresh process, the lowest live rank's tracked state loaded into the objects its replayed setup cells made.
        Then every rank runs again the notebook's assignments of its own rank values (``rank =
        get_context().get_world_rank()``, ``world_size``...); :attr:`rank_values` names them, and the names computed
        from them that were not re-evaluated. Raises GroupError: no dead worker, or no live worker to copy state
        from (and no ``from_checkpoint``).
        """
        self.run_storage.recover()
        replaced = restart(self._core, self._formation, from_checkpoint is not None)
        if from_checkpoint is not None:
            self.rollback(from_checkpoint)
        return replaced

    def rescale(self, num_workers: int) -> None:
        """Grow or shrink the group to ``num_workers``, keeping the warm state (GroupError / ResourceError: a bad
        size, or not enough resources, naming the numbers). Dead workers are dropped first; new ranks replay the setup
        cells and get a live peer's state; the process group is re-formed at the new size, DDP models re-wrapped and
        ``prepare_data_loader`` samplers re-sharded; fresh processes (``tensorflow``) and rank values as in restart.
        """
        self.run_storage.recover()
        rescale(self._core, self._formation, num_workers)

    def shutdown(self) -> None:
        """Stop every worker and free the resources (the Ray instance stays up)."""
        if self._core.state is GroupState.SHUTDOWN:
            return
        if self._core.taken_by:
            raise GroupError(self._core.taken_by)
        if self._monitor is not None:
            self._monitor.stop(wait_s=CONTROL_CALL_S)  # its check under way ends first: the kills are no failure
        teardown(self._core)
        if self._survival is not None:
            self._survival.end("shut down by its driver")
        self._core.transition(GroupState.SHUTDOWN)
        leave(self)

    def __repr__(self) -> str:
        return (f"WorkerGroup(name={self.name!r}, workers={self.num_workers}, backend={self.backend!r}, "
                f"state={self.state.value!r})")
