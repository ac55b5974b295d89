"""Running code on a group: cells and functions, their output, moving values.

:class:`Runner` acts on a group's core (``core.py``); the public ``WorkerGroup`` methods ``run``, ``execute``,
``push``, ``pull`` and ``reload`` call it. One cell runs at a time: the runner's lock is held while a cell is in
flight (not the core's, which the monitor needs meanwhile).
"""
from __future__ import annotations

import functools
import importlib
import logging
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence

from ..errors import GroupError, RankFailure, WorkerError
from ..output import OUTPUT_MODES, OutputSink, TextSink
from ..worker.cell import format_user_traceback, needs_ipython
from ..worker.collective import CollectiveSpec
from ..worker.outcome import CellOutcome
from ..worker.sharded import ShardedPull
from . import timing
from .background import BackgroundRun
from .channel_calls import ask_over
from .channels import channels_for, claimed
from .collectives import CollectiveRounds
from .dispatch import Dispatch
from .fanout import FANOUT, ReplyKind
from .formation import group_intact
from .mirrors import pull_sharded
from .recovery import ON_FAILURE, recover_and_retry
from .slots import Slot
from .state import GroupState, SlotState
from .types import CellRecord, CellResult

if TYPE_CHECKING:  # handed in; never imported here at run time
    from .core import GroupCore
    from .formation import Formation
    from .group import WorkerGroup

logger = logging.getLogger(__name__)


def wire(spec: Optional[CollectiveSpec]) -> Optional[List[Any]]:
    """A rank's collective spec as a cell's request carries it (:meth:`CollectiveSpec.to_wire`)."""
    return None if spec is None else spec.to_wire()


class Runner:
    """Cells, functions and values of one group: ``core`` holds its parts, ``formation`` re-forms it after a
    broken collective, ``owner`` (the public group) is what ``--on-failure`` and a background cell act on."""

    def __init__(self, core: "GroupCore", formation: "Formation", owner: "WorkerGroup") -> None:
        self.core, self.formation, self.owner = core, formation, owner
        self._cell_lock = threading.RLock()
        self.rounds = CollectiveRounds()  # raytrain_nb.collective: each call's round, rank 0's worker for each rank

    def targets(self, ranks: Optional[Sequence[int]]) -> List[int]:
        if ranks is None:
            return list(range(self.core.num_workers))
        bad = [r for r in ranks if not isinstance(r, int) or not 0 <= r < self.core.num_workers]
        if bad:
            raise GroupError(f"ranks {bad} do not exist: the group has ranks 0..{self.core.num_workers - 1}")
        return sorted(set(ranks))

    def run(self, source: str, ranks: Optional[Sequence[int]] = None, *, output: str = "rank0",
            sink: Optional[OutputSink] = None, setup: Optional[bool] = None, on_failure: str = "raise",
            max_failures: int = 1, background: bool = False, quiet_after_s: float = 0.0,
            prompt: Optional[Callable[[str], str]] = None) -> Any:
        """Run cell source on the ranks (see ``WorkerGroup.run``)."""
        if output not in OUTPUT_MODES:
            raise GroupError(f"output={output!r} is unknown: use rank0, all or none")
        if on_failure not in ON_FAILURE:
            raise GroupError(f"on_failure={on_failure!r} is unknown: use raise, restart or rescale")
        sink = sink or TextSink()
        if background:
            self.core.check_usable()
            self.core.background = BackgroundRun(self.owner, lambda: self.run(
                source, ranks, output=output, sink=sink, setup=setup, on_failure=on_failure,
                max_failures=max_failures))
            return self.core.background
        attempt = 0
        while True:
            try:
                return self.run_once(source, ranks, output, sink, setup, quiet_after_s, prompt)
            except WorkerError as exc:
                if not recover_and_retry(self.owner, exc, on_failure, attempt, max_failures, sink):
                    raise
                attempt += 1

    def run_once(self, source: str, ranks: Optional[Sequence[int]], output: str, sink: OutputSink,
                 setup: Optional[bool], quiet_after_s: float = 0.0,
                 prompt: Optional[Callable[[str], str]] = None) -> CellResult:
        self.core.check_usable()
        self.form_if_unformed(sink)
        targets = self.targets(ranks)
        cell_id = self.core.next_cell_id()
        if not needs_ipython(source) and not _parses(source):
            try:
                compile(source, f"<cell-{cell_id}>", "exec")
            except SyntaxError as exc:  # reported once, before any worker runs anything
                tb = format_user_traceback(exc)
                raise WorkerError([RankFailure(r, "SyntaxError", str(exc), tb) for r in targets]) from None
        started = time.perf_counter()
        shown = targets[:1] if output == "rank0" else targets
        base = self.core.run_storage.report_base
        if self.core.run_storage.background_error:
            sink.notice(f"an earlier background checkpoint failed and was discarded: "
                        f"{self.core.run_storage.background_error}")
            self.core.run_storage.background_error = None
        try:
            partial = len(targets) < self.core.num_workers

            def request(fw: Any, co: Any) -> List[Any]:  # Worker.run_cell_packed's one argument
                return [source, cell_id, True, base, partial, fw, wire(co)]

            self.core.running_cell = cell_id
            results = self.dispatch(lambda s, fw, co: s.actor.run_cell_packed.remote(request(fw, co)),
                                    targets, sink, output, shown, quiet_after_s=quiet_after_s, prompt=prompt,
                                    packed=lambda co: request(None, co))
        finally:
            self.core.running_cell = None
            self.core.run_storage.advance(max(self.core.reports_seen(base), 0))
        values = {r: res.value for r, res in results.items()}
        prints = [res.fingerprint for res in results.values()]
        for name in set(prints[0]).intersection(*prints[1:]) if prints else ():
            if len({p[name] for p in prints}) > 1:
                self.core.rank_specific.add(name)
        if len(targets) == self.core.num_workers:
            reports = max(res.reports for res in results.values())
            trained = reports or max(res.forwards for res in results.values())
            self.core.history.append(CellRecord(cell_id, source, not trained if setup is None else bool(setup),
                                                reports, time.time()))
            stepped = any(res.shards_stepped for res in results.values())
            self.core.mirrors.after_cell(self.core, bool(trained), stepped)  # a sharded group: shards to buddies
        return CellResult(values=values, duration=time.perf_counter() - started)

    def form_if_unformed(self, sink: OutputSink) -> None:
        """Before a cell: when the last forming of the process group failed (after an interrupt or a broken
        collective), form it again first, so the cell's ranks start together inside one group; a rank still in
        the failed forming is released, and one that does not leave it in time is named (``await_settled``)."""
        if self.core.unformed and self.core.kind.process_group:
            sink.notice("the process group did not form again after the last interrupt or failure: "
                        "it forms before this cell")
            self.formation.reform()

    def execute(self, fn: Callable[..., Any], *args: Any, ranks: Optional[Sequence[int]] = None,
                sink: Optional[OutputSink] = None, output: str = "rank0", **kwargs: Any) -> List[Any]:
        """Call ``fn`` on each targeted worker; per-rank results in rank order (see ``WorkerGroup.execute``)."""
        if output not in OUTPUT_MODES:
            raise GroupError(f"output={output!r} is unknown: use rank0, all or none")
        self.core.check_usable()
        self.form_if_unformed(sink or TextSink())
        targets = self.targets(ranks)
        base = self.core.run_storage.report_base
        try:
            partial = len(targets) < self.core.num_workers
            results = self.dispatch(
                lambda s, fw, co: s.actor.execute_packed.remote([fn, args, kwargs, base, partial, fw, wire(co)]),
                targets, sink or TextSink(), output, targets[:1] if output == "rank0" else targets)
        finally:
            self.core.run_storage.advance(max(self.core.reports_seen(base), 0))
        return [results[r].value for r in targets]

    def dispatch(self, submit: Callable[[Slot, Any, Any], Any], targets: List[int], sink: OutputSink,
                 mode: str, shown: Sequence[int], quiet_after_s: float = 0.0,
                 prompt: Optional[Callable[[str], str]] = None,
                 packed: Optional[Callable[[Any], List[Any]]] = None) -> Dict[int, CellOutcome]:
        """Run one call on ``targets``: ``submit(slot, framework spec, collective spec)`` sends it to a rank
        (``quiet_after_s``, ``prompt``: the quiet-cell notice and the debugger prompt, ``cellwatch.py``).
        ``packed(collective spec)``: a cell's request as ``Worker.run_cell_packed`` takes it, sent over the ranks'
        cell channels instead where every target has one and no framework backend wraps the cell (``channels.py``)."""
        with self._cell_lock:
            self.core.vitals.new_cell()
            collectives = self.rounds.specs([s.actor for s in self.core.slots], targets)
            for r in targets:  # before the state change, so observers see the running ranks
                self.core.slots[r].mark(SlotState.RUNNING)
            self.core.transition(GroupState.RUNNING)
            try:
                with self.core.driver_cell(targets) as specs:  # a framework backend's collective for this cell
                    lines = channels_for(self.core, targets) if packed is not None and all(s is None for s in specs) else None
                    with claimed(lines) as lines:
                        if lines is not None:
                            refs = {lines[r].send(packed(co)): r for r, co in zip(targets, collectives)}
                        else:
                            refs = {submit(self.core.slots[r], spec, co): r
                                    for r, spec, co in zip(targets, specs, collectives)}
                        run = Dispatch(self.core, self.owner.replace, refs, sink, mode, shown, prompt, quiet_after_s)
                        results = run.collect()
            except BaseException:
                self._settle({})
                raise
            return self._finish(run, results, sink, mode, shown)

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
        if not dead and not replaced and broken and self.core.kind.process_group:
            self.formation.reform(keep_group=group_intact(list(results.values()), len(self.core.slots),
                                                          run.released))
        if failures:
            released = sorted(r for r, res in results.items() if res.failure is not None and res.failure.collateral)
            raise WorkerError(failures, released=released if len(released) < len(failures) else (),
                              reformed=not dead)
        return results

    def _settle(self, results: Dict[int, CellOutcome]) -> None:
        any_dead = False
        for slot in self.core.slots:
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
        self.core.transition(GroupState.FAILED if any_dead else GroupState.IDLE)

    # -- moving values -------------------------------------------------------------------

    def push(self, **values: Any) -> None:
        """Bind ``values`` in every worker's namespace (see ``WorkerGroup.push``)."""
        import cloudpickle  # cloudpickle: optional or heavy, loaded on first use
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        self.core.check_usable()
        for name, value in values.items():
            try:
                cloudpickle.dumps(value)
            except Exception as exc:
                raise GroupError(f"cannot push {name!r}: a {type(value).__name__} cannot be pickled ({exc})") from None
        ref = ray.put(values)
        self.core.collect([s.actor.push.remote(ref) for s in self.core.slots], timing.PUSH_S, "receive values in")
        self.core.pushed.update(values)  # a new rank gets them before it replays the cells

    def pull(self, name: str, rank: Optional[int] = 0) -> Any:
        """A variable from one rank, or a list from every rank (see ``WorkerGroup.pull``)."""
        if self.core.state is GroupState.SHUTDOWN:
            self.core.check_not_running()
        targets = self.targets(None if rank is None else [rank])
        what = f"{name!r} from rank(s) {', '.join(map(str, targets))}"

        def call(slot: Slot) -> Any:
            return slot.actor.pull.remote(name)

        replies = ask_over(self.core, targets, "pull", name, timing.PULL_S, what, call)  # None: Ray calls
        if replies is None:
            replies = FANOUT.ask([self.core.slots[r] for r in targets], call, timing.PULL_S, what, ranks=targets)
        late = replies.ranks(ReplyKind.LATE)
        if late:
            raise GroupError(f"cannot pull {name!r}: rank(s) {', '.join(map(str, late))} did not answer within "
                             f"{timing.PULL_S:g} s (stopped, or busy in C code holding the GIL): %dist_status shows "
                             "them, %dist_restart replaces stopped ranks")
        sharded = [r.error for r in replies.of(ReplyKind.RAISED) if isinstance(r.error, ShardedPull)]
        if sharded:  # a sharded model: its gathered state dict, below a size
            return pull_sharded(self.core, sharded[0], rank)
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
        """Re-import ``module`` on every rank (see ``WorkerGroup.reload``)."""
        self.core.check_usable()
        return self.execute(_reload, module)


@functools.lru_cache(maxsize=256)
def _parses(source: str) -> bool:
    """Whether ``source`` compiles (the same cell run again is not compiled again to tell)."""
    try:
        compile(source, "<cell>", "exec")
    except SyntaxError:
        return False
    return True


def _reload(module: str) -> str:
    importlib.invalidate_caches()
    mod = sys.modules.get(module)
    mod = importlib.reload(mod) if mod is not None else importlib.import_module(module)
    return getattr(mod, "__file__", "") or ""
