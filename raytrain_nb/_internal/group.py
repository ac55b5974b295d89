"""WorkerGroup: a persistent group of Ray actors that runs cells and functions.

The magics and (later) the dashboard are thin layers over the public methods
here; everything a user can click can be scripted.
"""
from __future__ import annotations

import collections
import dataclasses
import enum
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional, Sequence

from . import cluster
from .cell import format_user_traceback, needs_ipython
from .config import GroupConfig
from .errors import GroupError, RankFailure, WorkerError
from .output import OUTPUT_MODES, OutputSink, TextSink, route
from .checkpointing import RollbackResult, RunStorage
from .monitor import DEFAULT_HEARTBEAT_TIMEOUT_S, HealthMonitor
from .placement import reserve
from .ranks import RankInfo, assign_ranks, rank_infos

logger = logging.getLogger(__name__)

POLL_INTERVAL_S = 0.1
INTERRUPT_WAIT_S = 2.0
METRICS_HISTORY = 10_000


class GroupState(enum.Enum):
    """Lifecycle of a group; observers subscribe with :meth:`WorkerGroup.subscribe`."""

    STARTING = "starting"
    IDLE = "idle"
    RUNNING = "running"
    FAILED = "failed"
    RECOVERING = "recovering"
    SHUTDOWN = "shut down"


@dataclasses.dataclass
class WorkerStatus:
    """One row of :meth:`WorkerGroup.status`."""

    rank: int
    node: str
    pid: int
    device: str
    state: str
    last_metrics: Dict[str, Any]
    error: str = ""


@dataclasses.dataclass
class CellResult:
    """What :meth:`WorkerGroup.run` returns: each rank's displayed value and the wall time."""

    values: Dict[int, Any]
    duration: float

    @property
    def value(self) -> Optional[str]:
        """The ``text/plain`` value of the lowest rank that returned one."""
        for rank in sorted(self.values):
            if self.values[rank] is not None:
                return self.values[rank][0].get("text/plain")
        return None


@dataclasses.dataclass
class CellRecord:
    """A cell that ran without error on every rank (what a new rank replays if ``setup``)."""

    cell_id: int
    source: str
    setup: bool
    reports: int
    time: float


@dataclasses.dataclass
class _Slot:
    actor: Any
    pg: Any
    bundle: int
    info: Dict[str, Any]
    rank_info: Optional[RankInfo] = None
    device: str = "cpu"
    state: str = "starting"
    error: str = ""


_ACTIVE: Optional["WorkerGroup"] = None


def active_group() -> Optional["WorkerGroup"]:
    """The group the magics use (the latest one started and not shut down), or None."""
    return _ACTIVE


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
                 placement_timeout_s: float = 10.0, start_timeout_s: float = 180.0,
                 heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S, spares: int = 0,
                 storage_path: Optional[str] = None, num_to_keep: Optional[int] = None,
                 checkpoint_score_attribute: Optional[str] = None, checkpoint_score_order: str = "max",
                 activate: bool = True) -> None:
        global _ACTIVE
        self.config = GroupConfig(num_workers=num_workers, cpus_per_worker=cpus_per_worker,
                                  gpus_per_worker=gpus_per_worker, resources_per_worker=resources_per_worker,
                                  placement_strategy=placement_strategy, backend=backend)
        self.backend = self.config.resolved_backend
        self.address = address
        self.name = name or time.strftime("run-%Y%m%d-%H%M%S")
        self.start_timeout_s = start_timeout_s
        self.state = GroupState.STARTING
        self._observers: List[Callable[[GroupState, GroupState], None]] = []
        self._metric_observers: List[Callable[[Sequence[Dict[str, Any]]], None]] = []
        self._lock = threading.RLock()
        self._state_lock = threading.RLock()
        self._slots: List[_Slot] = []
        self._free: List[Any] = []  # (placement group, bundle) reserved but unused
        self._pgs: List[Any] = []
        self.history: List[CellRecord] = []
        self._max_report_index = -1
        self.background: Optional[Any] = None  # the latest BackgroundRun
        self.replay_failures: List[str] = []  # setup cells that failed when a new rank replayed them
        self.rank_specific: set = {"rank", "local_rank", "world_rank", "ctx"}  # plain names that differ by rank
        self._cell_seq = 0
        self.latest_metrics: Dict[int, Dict[str, Any]] = {}
        self.metrics_history: Dict[int, Deque[Dict[str, Any]]] = {}
        self.storage_path = storage_path
        self.num_spares = spares
        self.run_storage = RunStorage(storage_path, self.name, num_to_keep, checkpoint_score_attribute,
                                      checkpoint_score_order)
        cluster.connect(address)
        self.placement_timeout_s = placement_timeout_s
        if isinstance(spares, bool) or not isinstance(spares, int) or spares < 0:
            raise GroupError(f"spares={spares!r} is not allowed: give a whole number, 0 or more (--spares 1)")
        pg = reserve(self.config, num_workers + spares, placement_timeout_s)
        self._pgs.append(pg)
        self._spares: List[_Slot] = []
        try:
            self._spares = [self._spawn(pg, i) for i in range(num_workers, num_workers + spares)]
            for spare in self._spares:
                spare.actor.warm.remote()
            slots = [self._spawn(pg, i) for i in range(num_workers)]
            self._slots = self._order(slots)
            self._rendezvous("setup")
            self._get([s.actor.set_storage.remote(self.run_storage.url) for s in self._slots], 60, "start")
            self.run_storage.check_shared(self)
        except BaseException:
            self._teardown()
            raise
        self._set_state(GroupState.IDLE)
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

    def _set_state(self, new: GroupState) -> None:
        with self._state_lock:
            old, self.state = self.state, new
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
        return len(self._slots)

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
        dead = [i for i, s in enumerate(self._slots) if s.state in ("dead", "unresponsive")]
        if dead:
            raise GroupError(
                f"rank(s) {', '.join(map(str, dead))} are dead or not responding: %dist_restart (group.restart()) "
                "replaces them, %dist_rescale N (group.rescale(n)) continues without them"
            )

    # -- failures noticed by the monitor -------------------------------------------------

    def _slot_of(self, actor: Any) -> Optional[int]:
        return next((i for i, s in enumerate(self._slots) if s.actor is actor), None)

    def _mark_dead(self, actor: Any, cause: str) -> None:
        """A worker process is gone (called by the monitor or the dispatcher)."""
        with self._state_lock:
            rank = self._slot_of(actor)
            if rank is None or self._slots[rank].state == "dead":
                return
            slot = self._slots[rank]
            slot.state = "dead"
            slot.error = cause
            logger.warning("rank %d (pid %s, node %s) died: %s", rank, slot.info.get("pid"),
                           slot.info.get("node_ip"), cause)
            if self.state is GroupState.IDLE:
                self._set_state(GroupState.FAILED)
            else:
                self._notify()

    def _mark_unresponsive(self, actor: Any, silent_s: float) -> None:
        with self._state_lock:
            rank = self._slot_of(actor)
            if rank is None or self._slots[rank].state in ("dead", "unresponsive"):
                return
            slot = self._slots[rank]
            slot.state = "unresponsive"
            slot.error = (f"has not answered for {silent_s:.0f} s (stopped, e.g. SIGSTOP, or blocked in C code "
                          "holding the GIL)")
            logger.warning("rank %d (pid %s) %s", rank, slot.info.get("pid"), slot.error)
            if self.state is GroupState.IDLE:
                self._set_state(GroupState.FAILED)
            else:
                self._notify()

    # -- forming the group ---------------------------------------------------------------

    def _spawn(self, pg: Any, bundle: int) -> _Slot:
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from .worker import remote_worker_class

        opts: Dict[str, Any] = dict(
            num_cpus=self.config.cpus_per_worker,
            num_gpus=self.config.gpus_per_worker,
            resources=dict(self.config.resources_per_worker or {}),
            max_restarts=0,
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=bundle),
        )
        shipped = cluster.shipped_working_dir()  # then Ray runs workers in a copy of the folder
        cwd = None if shipped else os.getcwd()
        preload = ("torch", "torch.distributed") if self.backend != "none" else ()
        actor = remote_worker_class().options(**opts).remote(cwd=cwd, sys_path=[] if shipped else [os.getcwd()],
                                                             preload=preload)
        return _Slot(actor=actor, pg=pg, bundle=bundle, info={})

    def _describe(self, slots: List[_Slot]) -> None:
        infos = self._get([s.actor.info.remote() for s in slots], self.start_timeout_s, "start")
        for slot, info in zip(slots, infos):
            slot.info = info

    def _order(self, slots: List[_Slot]) -> List[_Slot]:
        self._describe(slots)
        order = assign_ranks([s.info["node_id"] for s in slots], cluster.driver_node_id())
        return [slots[i] for i in order]

    def _contexts(self) -> List[Any]:
        infos = rank_infos([s.info["node_id"] for s in self._slots])
        for slot, info in zip(self._slots, infos):
            slot.rank_info = info
        return infos

    def _rendezvous(self, method: str, src: int = 0, fresh: Sequence[int] = ()) -> None:
        """Form the process group over ``self._slots`` in rank order.

        ``setup`` on a new group; ``join`` to re-form one (after an interrupt,
        a failure or a resize), broadcasting replicated state from rank ``src``;
        ranks in ``fresh`` also receive the plain variables they lack.
        """
        infos = self._contexts()
        master = self._slots[0]
        addr = master.info["node_ip"]
        port = 0
        if self.backend != "none":
            port = self._get([master.actor.open_store.remote(addr, len(self._slots))], 60, "start")[0]
        refs = []
        for rank, (slot, info) in enumerate(zip(self._slots, infos)):
            ctx, env = info.context(self.name), info.env(addr, port)
            if method == "setup":
                refs.append(slot.actor.setup.remote(ctx, env, self.backend, addr, port))
            else:
                refs.append(slot.actor.join.remote(ctx, env, addr, port, src, rank in fresh,
                                                   sorted(self.rank_specific)))
        results = self._get(refs, self.start_timeout_s, "form the process group of")
        for slot, res in zip(self._slots, results):
            if method == "setup":
                slot.device = res["device"]
            slot.state = "idle"
            slot.error = ""

    def _get(self, refs: List[Any], timeout: float, what: str) -> List[Any]:
        import ray

        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError:
            raise GroupError(
                f"the workers did not {what} the group within {timeout:g} s "
                f"({len(refs)} workers); raise start_timeout_s or check `ray status`"
            ) from None
        except ray.exceptions.RayActorError as exc:
            raise GroupError(f"a worker died while trying to {what} the group: {_first_line(exc)}") from None
        except ray.exceptions.RayTaskError as exc:
            cause = getattr(exc, "cause", None) or exc
            raise GroupError(f"the workers could not {what} the group: {type(cause).__name__}: "
                             f"{_first_line(cause)}") from None

    def _reform(self) -> None:
        self._rendezvous("join")

    # -- running code --------------------------------------------------------------------

    def _targets(self, ranks: Optional[Sequence[int]]) -> List[int]:
        if ranks is None:
            return list(range(self.num_workers))
        bad = [r for r in ranks if not isinstance(r, int) or not 0 <= r < self.num_workers]
        if bad:
            raise GroupError(f"ranks {bad} do not exist: the group has ranks 0..{self.num_workers - 1}")
        return sorted(set(ranks))

    def run(self, source: str, ranks: Optional[Sequence[int]] = None, *, output: str = "rank0",
            sink: Optional[OutputSink] = None, setup: Optional[bool] = None, on_failure: str = "raise",
            max_failures: int = 1, background: bool = False) -> Any:
        """Run cell source in each worker's persistent namespace (IPython semantics).

        Output streams to ``sink`` while the cell runs; the value of a trailing
        expression is rendered on the worker and passed to ``sink.value``.

        Args:
            source: the cell's code.
            ranks: the ranks to run on (default: all).
            output: ``rank0`` (the lowest targeted rank), ``all`` (labelled) or ``none``.
            sink: where output goes (default: this process's stdout/stderr).
            setup: whether a new rank must replay this cell to rebuild its namespace;
                by default, cells that neither called ``report()`` nor ran a prepared model.
            on_failure: when a worker dies: ``raise`` (default), ``restart`` (replace it,
                state from a live peer) or ``rescale`` (continue with the survivors); then
                the cell runs again, at most ``max_failures`` times (-1: no limit).
            background: return at once a :class:`BackgroundRun` (``.wait()`` for the result);
                output keeps going to ``sink``; status, checkpoint, interrupt and pull work meanwhile.

        Returns:
            A :class:`CellResult`.

        Raises:
            WorkerError: the cell raised on some ranks (merged, shown as the cell's traceback).
        """
        from .recovery import ON_FAILURE, recover_and_retry

        if output not in OUTPUT_MODES:
            raise GroupError(f"output={output!r} is unknown: use rank0, all or none")
        if on_failure not in ON_FAILURE:
            raise GroupError(f"on_failure={on_failure!r} is unknown: use raise, restart or rescale")
        sink = sink or TextSink()
        if background:
            from .background import BackgroundRun

            self._check_usable()
            self.background = BackgroundRun(self, lambda: self.run(
                source, ranks, output=output, sink=sink, setup=setup, on_failure=on_failure,
                max_failures=max_failures))
            return self.background
        attempt = 0
        while True:
            try:
                return self._run_once(source, ranks, output, sink, setup)
            except WorkerError as exc:
                if not recover_and_retry(self, exc, on_failure, attempt, max_failures, sink):
                    raise
                attempt += 1

    def _run_once(self, source: str, ranks: Optional[Sequence[int]], output: str, sink: OutputSink,
                  setup: Optional[bool]) -> CellResult:
        self._check_usable()
        targets = self._targets(ranks)
        self._cell_seq += 1
        cell_id = self._cell_seq
        if not needs_ipython(source):
            try:
                compile(source, f"<cell-{cell_id}>", "exec")
            except SyntaxError as exc:  # reported once, before any worker runs anything
                tb = format_user_traceback(exc)
                raise WorkerError([RankFailure(r, "SyntaxError", str(exc), tb) for r in targets]) from None
        started = time.perf_counter()
        shown = targets[:1] if output == "rank0" else targets
        base = self.run_storage.report_base
        if self.run_storage.background_error:
            sink.notice(f"an earlier background checkpoint failed and was discarded: "
                        f"{self.run_storage.background_error}")
            self.run_storage.background_error = None
        try:
            results = self._dispatch(lambda s: s.actor.run_cell.remote(source, cell_id, True, base), targets,
                                     sink, output, shown)
        finally:
            self.run_storage.advance(max(self._reports_seen(base), 0))
        values = {r: res.get("value") for r, res in results.items()}
        prints = [res.get("fingerprint") or {} for res in results.values()]
        for name in set(prints[0]).intersection(*prints[1:]) if prints else ():
            if len({p[name] for p in prints}) > 1:
                self.rank_specific.add(name)
        if len(targets) == self.num_workers:
            reports = max(res.get("reports", 0) for res in results.values())
            trained = reports or max(res.get("forwards", 0) for res in results.values())
            self.history.append(CellRecord(cell_id, source, not trained if setup is None else bool(setup),
                                           reports, time.time()))
        return CellResult(values=values, duration=time.perf_counter() - started)

    def execute(self, fn: Callable[..., Any], *args: Any, ranks: Optional[Sequence[int]] = None,
                sink: Optional[OutputSink] = None, output: str = "rank0", **kwargs: Any) -> List[Any]:
        """Call ``fn(*args, **kwargs)`` on each targeted worker; return per-rank results in rank order.

        ``output``: whose output reaches ``sink``: ``rank0`` (default), ``all`` (labelled) or ``none``.
        """
        if output not in OUTPUT_MODES:
            raise GroupError(f"output={output!r} is unknown: use rank0, all or none")
        self._check_usable()
        targets = self._targets(ranks)
        base = self.run_storage.report_base
        try:
            results = self._dispatch(lambda s: s.actor.execute.remote(fn, args, kwargs, base), targets,
                                     sink or TextSink(), output, targets[:1] if output == "rank0" else targets)
        finally:
            self.run_storage.advance(max(self._reports_seen(base), 0))
        return [results[r]["value"] for r in targets]

    def _dispatch(self, submit: Callable[[_Slot], Any], targets: List[int], sink: OutputSink,
                  mode: str, shown: Sequence[int]) -> Dict[int, Dict[str, Any]]:
        from .dispatch import Dispatch

        with self._lock:
            for r in targets:  # before the state change, so observers see the running ranks
                self._slots[r].state = "running"
            self._set_state(GroupState.RUNNING)
            try:
                run = Dispatch(self, {submit(self._slots[r]): r for r in targets}, sink, mode, shown)
                results = run.collect()
            except BaseException:
                self._settle({})
                raise
            return self._finish(run, results, sink, mode, shown)

    def _finish(self, run: Any, results: Dict[int, Dict[str, Any]], sink: OutputSink, mode: str,
                shown: Sequence[int]) -> Dict[int, Dict[str, Any]]:
        failures = [res["failure"] for res in results.values() if res.get("failure") is not None]
        if mode != "none":
            for rank in shown:
                value = results.get(rank, {}).get("value")
                if value is not None and not failures and isinstance(value, tuple):
                    sink.value(rank, value[0], value[1], mode == "all")
        self._settle(results)
        dead = [r for r, res in results.items() if res.get("dead")]
        broken = run.released or any(res.get("pg_broken") or res.get("interrupted") for res in results.values())
        replaced = any(res.get("replaced") for res in results.values())
        if not dead and not replaced and broken and self.backend != "none":
            self._reform()
        if failures:
            released = sorted(r for r, res in results.items()
                              if res.get("failure") is not None and res["failure"].collateral)
            raise WorkerError(failures, released=released if len(released) < len(failures) else (),
                              reformed=not dead)
        return results

    def _settle(self, results: Dict[int, Dict[str, Any]]) -> None:
        any_dead = False
        for slot in self._slots:
            rank = slot.rank_info.world_rank if slot.rank_info else -1
            res = results.get(rank, {})
            if res.get("dead"):
                slot.state, slot.error, any_dead = "dead", res["failure"].message, True
            elif slot.state == "running":
                failure = res.get("failure")
                own = failure is not None and not failure.collateral  # released ranks are fine
                slot.state = "failed" if own else "idle"
                slot.error = failure.message if own else ""
            elif slot.state in ("dead", "unresponsive"):
                any_dead = True
        self._set_state(GroupState.FAILED if any_dead else GroupState.IDLE)

    def _reports_seen(self, base: int) -> int:
        """How many reports the last cell made (numbered from ``base``), from what reached the driver."""
        return self._max_report_index - base + 1 if self._max_report_index >= base else 0

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
            self.metrics_history.setdefault(rank, collections.deque(maxlen=METRICS_HISTORY)).append(rec)
        for cb in list(self._metric_observers):
            try:
                cb(records)
            except Exception:
                logger.exception("metrics observer failed")

    # -- moving values -------------------------------------------------------------------

    def push(self, **values: Any) -> None:
        """Bind ``values`` in every worker's namespace.

        Raises:
            GroupError: a value cannot be pickled (names the variable).
        """
        import cloudpickle
        import ray

        self._check_usable()
        for name, value in values.items():
            try:
                cloudpickle.dumps(value)
            except Exception as exc:
                raise GroupError(f"cannot push {name!r}: a {type(value).__name__} cannot be pickled ({exc})") from None
        ref = ray.put(values)
        self._get([s.actor.push.remote(ref) for s in self._slots], 120, "receive values in")

    def pull(self, name: str, rank: Optional[int] = 0) -> Any:
        """A variable from one rank (default 0) or, with ``rank=None``, a list from every rank.

        DDP models come back unwrapped and tensors on the CPU.

        Raises:
            GroupError: the name is not defined on a rank.
        """
        import ray

        if self.state is GroupState.SHUTDOWN:
            self._check_not_running()
        targets = self._targets(None if rank is None else [rank])
        refs = [self._slots[r].actor.pull.remote(name) for r in targets]
        values, missing, other = [], [], []
        for r, ref in zip(targets, refs):
            try:
                values.append(ray.get(ref, timeout=300))
            except ray.exceptions.RayTaskError as exc:
                cause = exc.cause if getattr(exc, "cause", None) is not None else exc
                (missing if isinstance(cause, NameError) else other).append((r, cause))
        if missing:
            ranks = ", ".join(str(r) for r, _ in missing)
            raise GroupError(f"name {name!r} is not defined on rank {ranks}: run the cell that defines it, "
                             "or check the spelling")
        if other:
            r, cause = other[0]
            raise GroupError(f"cannot pull {name!r} from rank {r}: {type(cause).__name__}: "
                             f"{str(cause).splitlines()[0] if str(cause) else ''}")
        return values if rank is None else values[0]

    def reload(self, module: str) -> List[str]:
        """Re-import ``module`` on every rank (after editing it); returns its file per rank."""
        self._check_usable()
        return self.execute(_reload, module)

    # -- looking and controlling ---------------------------------------------------------

    def status(self, ping: bool = True) -> List[WorkerStatus]:
        """One :class:`WorkerStatus` per rank; dead workers show as ``dead``.

        Args:
            ping: ask every live worker first (up to 3 s), so a death Ray knows of counts;
                ``False`` answers at once from what the group already knows (observers, the dashboard).
        """
        import ray

        live = [s for s in self._slots if ping and s.state not in ("dead", "unresponsive")]
        refs = {s.actor.ping.remote(): s for s in live}
        ready, _ = ray.wait(list(refs), num_returns=len(refs), timeout=3.0) if refs else ([], [])
        for ref in ready:
            try:
                ray.get(ref)
            except ray.exceptions.RayActorError as exc:
                refs[ref].state, refs[ref].error = "dead", _first_line(exc)
        if ping and any(s.state == "dead" for s in self._slots) and self.state is GroupState.IDLE:
            self._set_state(GroupState.FAILED)
        return [
            WorkerStatus(rank=i, node=s.info.get("node_ip", "?"), pid=s.info.get("pid", 0), device=s.device,
                         state=s.state, last_metrics=dict(self.latest_metrics.get(i, {})), error=s.error)
            for i, s in enumerate(self._slots)
        ]

    def interrupt(self) -> List[Dict[str, Any]]:
        """Interrupt the running code on every rank (KeyboardInterrupt in user code)."""
        import ray

        refs = [s.actor.interrupt.remote() for s in self._slots if s.state != "dead"]
        out = []
        for ref in refs:
            try:
                out.append(ray.get(ref, timeout=INTERRUPT_WAIT_S + 3))
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError) as exc:
                out.append({"state": "unreachable", "error": _first_line(exc)})
        return out

    def dashboard(self, **options: Any) -> Any:
        """This group's live dashboard (one per group): per-rank progress, a metrics plot, the
        checkpoint list and the recovery buttons. Shown when it is a cell's value.

        The widgets live in the notebook layer, imported here only when asked for, so the core
        never needs IPython or ipywidgets. ``options`` go to the dashboard the first time
        (e.g. ``plot_interval_s``).
        """
        from ..notebook.widgets import dashboard_for

        return dashboard_for(self, **options)

    def replace(self, ranks: Sequence[int]) -> None:
        """Replace the workers of ``ranks`` with fresh ones that get a live peer's state."""
        from .recovery import replace_ranks

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
        from .checkpointing import checkpoint

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
        from .checkpointing import rollback

        return rollback(self, name_or_index, run, allow_pickle)

    def attach_datasets(self, **datasets: Any) -> None:
        """Split Ray Data datasets across the ranks; ``get_dataset_shard(name)`` returns each rank's part.

        Each dataset is split with ``streaming_split(num_workers, equal=True)``, and split again
        after a restart or rescale. Example: ``group.attach_datasets(train=ray.data.range(1000))``.
        """
        from .datasets import attach

        attach(self, datasets)

    def checkpoints(self, kind: Optional[str] = None) -> List[Any]:
        """The run's checkpoints (``kind``: ``"snapshot"``, ``"reported"`` or all), oldest first."""
        from .checkpointing import wait_background

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
        that snapshot instead.

        Returns:
            The ranks replaced.

        Raises:
            GroupError: no dead worker, or no live worker to copy state from.
        """
        from .recovery import restart

        self.run_storage.recover()
        replaced = restart(self)
        if from_checkpoint is not None:
            self.rollback(from_checkpoint)
        return replaced

    def rescale(self, num_workers: int) -> None:
        """Grow or shrink the group to ``num_workers``, keeping the warm state.

        Dead workers are dropped first; new ranks replay the setup cells and get
        a live peer's state; the process group is re-formed at the new size,
        DDP models re-wrapped and ``prepare_data_loader`` samplers re-sharded.

        Raises:
            GroupError / ResourceError: a bad size, or not enough resources (names the numbers).
        """
        from .recovery import rescale

        rescale(self, num_workers)

    def shutdown(self) -> None:
        """Stop every worker and free the resources (the Ray instance stays up)."""
        global _ACTIVE
        if self.state is GroupState.SHUTDOWN:
            return
        if getattr(self, "_monitor", None) is not None:
            self._monitor.stop()
        self._teardown()
        self._set_state(GroupState.SHUTDOWN)
        if _ACTIVE is self:
            _ACTIVE = None

    def _teardown(self) -> None:
        import ray
        from ray.util.placement_group import remove_placement_group

        live = [s for s in self._slots if s.state != "dead"]
        if live:
            ray.wait([s.actor.shutdown_backend.remote() for s in live], num_returns=len(live), timeout=5)
        for s in self._slots + getattr(self, "_spares", []):
            try:
                ray.kill(s.actor, no_restart=True)
            except Exception:
                pass
        for pg in self._pgs:
            try:
                remove_placement_group(pg)
            except Exception:
                pass

    def __repr__(self) -> str:
        return f"WorkerGroup(name={self.name!r}, workers={self.num_workers}, backend={self.backend!r}, state={self.state.value!r})"


def _reload(module: str) -> str:
    import importlib

    importlib.invalidate_caches()
    mod = sys.modules.get(module)
    mod = importlib.reload(mod) if mod is not None else importlib.import_module(module)
    return getattr(mod, "__file__", "") or ""


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__
