"""Running code on a group: cells and functions, their output and metrics, moving values."""
from __future__ import annotations

import collections
import contextlib
import importlib
import logging
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..errors import GroupError, RankFailure, WorkerError
from ..output import OUTPUT_MODES, OutputSink, TextSink
from ..worker.cell import format_user_traceback, needs_ipython
from ..worker.outcome import CellOutcome
from . import timing
from .background import BackgroundRun
from .dispatch import Dispatch
from .fanout import FANOUT, ReplyKind
from .recovery import ON_FAILURE, recover_and_retry
from .slots import Slot
from .state import GroupState, SlotState
from .types import CellRecord, CellResult

logger = logging.getLogger(__name__)

#: Reported metrics kept per rank for the dashboard's plot.
METRICS_HISTORY = 10_000


class ExecutionMixin:
    """Cells, functions, values and metrics of a :class:`~raytrain_nb.WorkerGroup`."""

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
        if output not in OUTPUT_MODES:
            raise GroupError(f"output={output!r} is unknown: use rank0, all or none")
        if on_failure not in ON_FAILURE:
            raise GroupError(f"on_failure={on_failure!r} is unknown: use raise, restart or rescale")
        sink = sink or TextSink()
        if background:
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
            partial = len(targets) < self.num_workers
            results = self._dispatch(lambda s, fw: s.actor.run_cell.remote(source, cell_id, True, base, partial, fw),
                                     targets, sink, output, shown)
        finally:
            self.run_storage.advance(max(self._reports_seen(base), 0))
        values = {r: res.value for r, res in results.items()}
        prints = [res.fingerprint for res in results.values()]
        for name in set(prints[0]).intersection(*prints[1:]) if prints else ():
            if len({p[name] for p in prints}) > 1:
                self.rank_specific.add(name)
        if len(targets) == self.num_workers:
            reports = max(res.reports for res in results.values())
            trained = reports or max(res.forwards for res in results.values())
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
            partial = len(targets) < self.num_workers
            results = self._dispatch(lambda s, fw: s.actor.execute.remote(fn, args, kwargs, base, partial, fw),
                                     targets, sink or TextSink(), output, targets[:1] if output == "rank0" else targets)
        finally:
            self.run_storage.advance(max(self._reports_seen(base), 0))
        return [results[r].value for r in targets]

    def _dispatch(self, submit: Callable[[Slot], Any], targets: List[int], sink: OutputSink,
                  mode: str, shown: Sequence[int]) -> Dict[int, CellOutcome]:
        with self._lock:
            for r in targets:  # before the state change, so observers see the running ranks
                self.slots[r].mark(SlotState.RUNNING)
            self.transition(GroupState.RUNNING)
            try:
                with self._framework_cell(targets) as specs:  # a framework backend's collective for this cell
                    run = Dispatch(self, {submit(self.slots[r], spec): r for r, spec in zip(targets, specs)},
                                   sink, mode, shown)
                    results = run.collect()
            except BaseException:
                self._settle({})
                raise
            return self._finish(run, results, sink, mode, shown)

    @contextlib.contextmanager
    def _framework_cell(self, targets: List[int]) -> Any:
        """Yields per target ``(backend, spec)`` for the worker, or None each without a framework backend."""
        local = len({s.info.get("node_id") for s in self.slots}) == 1
        with self.kind.driver_cell(list(self.slots), targets, local) as specs:
            yield specs

    def _finish(self, run: Dispatch, results: Dict[int, CellOutcome], sink: OutputSink, mode: str,
                shown: Sequence[int]) -> Dict[int, CellOutcome]:
        failures = [res.failure for res in results.values() if res.failure is not None]
        if mode != "none":
            for rank in shown:
                value = results[rank].value if rank in results else None
                if value is not None and not failures and isinstance(value, tuple):
                    sink.value(rank, value[0], value[1], mode == "all")
        self._settle(results)
        dead = [r for r, res in results.items() if res.dead]
        broken = run.released or any(res.pg_broken or res.interrupted for res in results.values())
        replaced = any(res.replaced for res in results.values())
        if not dead and not replaced and broken and self.kind.process_group:
            self._reform()
        if failures:
            released = sorted(r for r, res in results.items() if res.failure is not None and res.failure.collateral)
            raise WorkerError(failures, released=released if len(released) < len(failures) else (),
                              reformed=not dead)
        return results

    def _settle(self, results: Dict[int, CellOutcome]) -> None:
        any_dead = False
        for slot in self.slots:
            rank = slot.rank_info.world_rank if slot.rank_info else -1
            res = results.get(rank)
            if res is not None and res.dead:
                slot.mark(SlotState.DEAD, res.failure.message if res.failure else "")
                any_dead = True
            elif slot.state == SlotState.RUNNING:
                own = res is not None and res.own_failure  # released ranks are fine
                slot.mark(SlotState.FAILED if own else SlotState.IDLE, res.failure.message if own else "")
            elif slot.gone:
                any_dead = True
        self.transition(GroupState.FAILED if any_dead else GroupState.IDLE)

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
        import cloudpickle  # cloudpickle: optional or heavy, loaded on first use
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        self._check_usable()
        for name, value in values.items():
            try:
                cloudpickle.dumps(value)
            except Exception as exc:
                raise GroupError(f"cannot push {name!r}: a {type(value).__name__} cannot be pickled ({exc})") from None
        ref = ray.put(values)
        self._get([s.actor.push.remote(ref) for s in self.slots], timing.PUSH_S, "receive values in")
        self.pushed.update(values)  # a new rank gets them before it replays the cells

    def pull(self, name: str, rank: Optional[int] = 0) -> Any:
        """A variable from one rank (default 0) or, with ``rank=None``, a list from every rank.

        DDP models come back unwrapped and tensors on the CPU.

        Raises:
            GroupError: the name is not defined on a rank, or a rank is dead or did not answer within
                ``timing.PULL_S`` (every rank is asked at once: a stopped rank costs one deadline).
        """
        if self.state is GroupState.SHUTDOWN:
            self._check_not_running()
        targets = self._targets(None if rank is None else [rank])
        replies = FANOUT.ask([self.slots[r] for r in targets], lambda s: s.actor.pull.remote(name), timing.PULL_S,
                             f"{name!r} from rank(s) {', '.join(map(str, targets))}", ranks=targets)
        late = replies.ranks(ReplyKind.LATE)
        if late:
            raise GroupError(f"cannot pull {name!r}: rank(s) {', '.join(map(str, late))} did not answer within "
                             f"{timing.PULL_S:g} s (stopped, or busy in C code holding the GIL): %dist_status shows "
                             "them, %dist_restart replaces stopped ranks")
        missing = [r.rank for r in replies.of(ReplyKind.RAISED) if isinstance(r.error, NameError)]
        if missing:
            raise GroupError(f"name {name!r} is not defined on rank {', '.join(map(str, missing))}: run the cell "
                             "that defines it, or check the spelling")
        other = [r for r in replies if not r.ok]
        if other:
            cause = other[0].error
            raise GroupError(f"cannot pull {name!r} from rank {other[0].rank}: {type(cause).__name__}: "
                             f"{str(cause).splitlines()[0] if str(cause) else ''}")
        values = [r.value for r in replies]
        return values if rank is None else values[0]

    def reload(self, module: str) -> List[str]:
        """Re-import ``module`` on every rank (after editing it); returns its file per rank."""
        self._check_usable()
        return self.execute(_reload, module)


def _reload(module: str) -> str:

    importlib.invalidate_caches()
    mod = sys.modules.get(module)
    mod = importlib.reload(mod) if mod is not None else importlib.import_module(module)
    return getattr(mod, "__file__", "") or ""
