"""A cell that was running when its kernel died, followed by the kernel that attached the group.

The cell kept running on the workers while no driver was attached: its output waited in each worker's bounded
buffer (``worker/capture.py``: beyond 4 M characters it is dropped and counted) and its reports in each worker's
session (the last 10,000; older ones go). Its reported checkpoints that every rank finished were committed when the
attaching driver opened the run (the crash path of ``checkpoint/run_storage.py``). :func:`follow` polls the ranks
as a cell's dispatch does: output from then on to ``sink``, reports to the core (those the crash path settled are
not committed again), and how many reports were lost meanwhile (a gap in a rank's sequence numbers) said once; it
returns when no rank runs the cell any more. The cell's value and error went to the kernel that started it.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Dict, List

from ..output import OutputSink, TextSink, route
from .background import BackgroundRun
from .fanout import FANOUT
from .state import GroupState, SlotState
from .timing import CONTROL_CALL_S, POLL_INTERVAL_S
from .types import CellResult

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)

#: What a worker's cell thread runs for a cell (``worker/cell_thread.py`` names the call).
CELL_CALLS = ("_run_cell", "_execute")


def running_ranks(core: "GroupCore") -> List[int]:
    """The live ranks that run a cell now (asked on the control channel)."""
    live = [s for s in core.slots if not s.gone]
    replies = FANOUT.ask(live, lambda s: s.actor.activity.remote(), CONTROL_CALL_S, "what every rank runs now")
    ranks = [core.slots.rank_of(s.actor) for s in live]
    return [r for r, reply in zip(ranks, replies) if reply.ok and reply.value.get("call") in CELL_CALLS]


def mark_running(core: "GroupCore", ranks: List[int]) -> None:
    for rank in ranks:
        core.slots[rank].mark(SlotState.RUNNING)
    core.transition(GroupState.RUNNING)


def _settled_before(core: "GroupCore", records: List[Dict[str, Any]], base: int) -> List[Dict[str, Any]]:
    """``records`` with the report name dropped from those the crash path settled at the attach (index < base)."""
    out = []
    for rec in records:
        name = rec.get("report")
        if name and int(str(name).rsplit("_", 1)[1]) < base:
            rec = {k: v for k, v in rec.items() if k != "report"}
        out.append(rec)
    return out


def _take(poll: Dict[str, Any], rank: int, sink: OutputSink, shown: List[int], mode: str, seen: Dict[int, int],
          lost: Dict[int, int]) -> List[Dict[str, Any]]:
    """Route one rank's polled output; return its records, counting a gap in their sequence as lost reports."""
    route(sink, rank, poll.get("outputs", []), shown, mode)
    got = list(poll.get("metrics", []))
    if got and rank in seen:  # the first records after the attach: a gap is what the worker's queue dropped
        gap = got[0].get("seq", 0) - seen.pop(rank) - 1
        if gap > 0:
            lost[rank] = gap
    return got


def follow(core: "GroupCore", ranks: List[int], sink: OutputSink, mode: str = "rank0") -> CellResult:
    """Stream the adopted cell's output and reports until no rank of ``ranks`` runs it, then say how it ended (and
    what is missing); returns a :class:`CellResult` without values (they went to the other kernel)."""
    started = time.perf_counter()
    base = core.run_storage.report_base
    seen = {r: max([rec.get("seq", 0) for rec in core.metrics_history.get(r, ())], default=0) for r in ranks}
    lost: Dict[int, int] = {}
    shown = [min(ranks)] if mode == "rank0" else list(ranks)
    active = list(ranks)
    failed: List[str] = []
    while active:
        slots = [core.slots[r] for r in active]
        polls = FANOUT.ask(slots, lambda s: s.actor.poll.remote(), CONTROL_CALL_S, "the adopted cell's output")
        records: List[Dict[str, Any]] = []
        done: List[int] = []
        for rank, reply in zip(active, polls):
            if not reply.ok:  # a rank that died: the group fails once the others end
                done.append(rank)
                continue
            got = _take(reply.value, rank, sink, shown, mode, seen, lost)
            records += got
            if reply.value.get("running") is None:
                done.append(rank)
        ends = FANOUT.ask([core.slots[r] for r in done], lambda s: s.actor.last_outcome.remote(), CONTROL_CALL_S,
                          "the adopted cell's outcome") if done else []
        for rank, reply in zip(done, ends):
            outcome = reply.value if reply.ok else None
            if outcome is not None:
                records += _take({"outputs": outcome.outputs, "metrics": outcome.metrics}, rank, sink, shown, mode,
                                 seen, lost)
                if outcome.failure is not None:
                    failed.append(f"rank {rank}: {outcome.failure.message.splitlines()[-1] if outcome.failure.message else '?'}")
            slot = core.slots[rank]
            if not slot.gone:
                slot.mark(SlotState.FAILED if outcome is not None and outcome.failure is not None else SlotState.IDLE)
        if records:
            core.record_metrics(_settled_before(core, records, base))
        active = [r for r in active if r not in done]
        if active:
            time.sleep(POLL_INTERVAL_S)  # the poll interval of a cell's dispatch; every call above has a deadline
    core.transition(GroupState.FAILED if core.slots.gone_ranks() else GroupState.IDLE)
    line = "the cell started in another kernel has ended" + (
        f" with an error ({'; '.join(failed)}; %dist_debug shows the traceback)" if failed else "")
    if lost:
        line += ("; reports missing from the metrics here (the other kernel received them in its last second, or a "
                 "worker's queue of 10,000 overflowed while no kernel was attached): " + ", ".join(
                     f"rank {r}: {n}" for r, n in sorted(lost.items())))
    sink.stream(min(ranks), "stdout", line + "\n", False)
    return CellResult(values={}, duration=time.perf_counter() - started)


def adopt(group: Any, core: "GroupCore", sink: Any, note: str) -> str:
    """At an attach: a cell still running on the ranks becomes the group's background cell (``%dist_wait`` waits,
    ``%dist_interrupt`` stops it), its output from now on going to ``sink``. Returns ``note`` with a word on it."""
    ranks = running_ranks(core)
    if not ranks:
        return note
    mark_running(core, ranks)
    core.background = BackgroundRun(group, lambda: follow(core, ranks, sink or TextSink()), "(started in another kernel)")
    said = (f"a cell started in the other kernel still runs on rank(s) {', '.join(map(str, ranks))}: its output "
            "follows here (%dist_wait waits for it, %dist_interrupt stops it)")
    return f"{note}; {said}" if note else said
