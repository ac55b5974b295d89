"""Figures 4c-4g: what one report() call costs on a worker, and what the per-report ledger adds to it.

Worker-side functions run through ``group.execute``: ``report_cost`` times 5000 calls (4c);
``report_ab`` times blocks of calls with the session's ``on_report`` hook as shipped (the ledger's append)
and as it was before the ledger, alternating on the same workers (4d-4g); ``pre_ledger_hook`` swaps that
hook for a whole cell (figure 4h, in ``bench_throughput``).
"""
from __future__ import annotations

from typing import Any, Dict, List

from common import Figure, fmt_stats, median_ci, stats


def report_cost(calls: int = 5000) -> Dict[str, float]:
    """(Worker side) seconds per ``raytrain_nb.report({...})`` call, the call alone, and the garbage
    collections that ran in that window (``gc_s``: their seconds, ``full``: how many were of the oldest
    generation).

    Garbage the earlier cells left is collected first: a full collection of a worker's heap (torch's
    ~350k objects: 0.3 s on a loaded 2-core machine) falls due after enough objects outlive two younger
    collections, whatever allocates last; billed to these 5000 calls it read as ~80 us a call."""
    import gc
    import time as _time

    import raytrain_nb as train

    gc.collect()
    spent = {"gc_s": 0.0, "full": 0, "t": 0.0}

    def timed(phase: str, info: Dict[str, Any]) -> None:
        if phase == "start":
            spent["t"] = _time.perf_counter()
        else:
            spent["gc_s"] += _time.perf_counter() - spent["t"]
            spent["full"] += info["generation"] == 2

    gc.callbacks.append(timed)
    try:
        t0 = _time.perf_counter()
        for i in range(calls):
            train.report({"loss": 0.5, "step": i})
        per_call = (_time.perf_counter() - t0) / calls
    finally:
        gc.callbacks.remove(timed)
    return {"per_call": per_call, "gc_s": spent["gc_s"], "full": spent["full"]}


#: (Worker side) the session's own on_report hook while :func:`pre_ledger_hook` has swapped it out.
SHIPPED_HOOK: Dict[str, Any] = {}


def pre_ledger_hook(on: bool) -> None:
    """(Worker side) swap the session's ``on_report`` for what it did before the ledger (the snapshot check
    under its lock), or (``on=False``) put the worker's own back."""
    import threading

    from raytrain_nb._internal.worker.session import current_session

    session = current_session()
    if not on:
        session.on_report = SHIPPED_HOOK.pop("hook")
        return
    lock = threading.Lock()
    request: List[Any] = [None]

    def pre_ledger(index: int) -> None:
        with lock:
            _, request[0] = request[0], None

    SHIPPED_HOOK["hook"] = session.on_report
    session.on_report = pre_ledger


AB_BLOCKS = 20
AB_CALLS = 1000


def report_ab(blocks: int = AB_BLOCKS, calls: int = AB_CALLS) -> Dict[str, Dict[str, List[float]]]:
    """(Worker side) us per ``raytrain_nb.report({...})`` call in blocks of ``calls``, wall time (``"wall"``)
    and the calling thread's CPU time (``"cpu"``: not counting time other processes had the core), the variants
    alternating (their order rotating) on this worker's session, only its ``on_report`` hook swapped:

    - ``ledger``: the worker's own hook (as shipped: the ledger's append, then the snapshot check);
    - ``pre-ledger``: what the hook did before the ledger was added: the snapshot check under its lock;
    - ``ledger, os.write``: the ledger as it was first written: the name formatted again and parsed back,
      ``os.write`` (which lets the GIL go) of the line to an O_APPEND file, the snapshot check under its lock.

    The driver drains the records on its poll meanwhile, as in training."""
    import os as _os
    import tempfile
    import threading
    import time as _time

    import raytrain_nb as train
    from raytrain_nb._internal.checkpoint import reported
    from raytrain_nb._internal.worker.session import current_session

    session = current_session()
    lock = threading.Lock()
    request: List[Any] = [None]

    def pre_ledger(index: int) -> None:
        with lock:
            _, request[0] = request[0], None

    fd, path = tempfile.mkstemp(prefix="rtnb-ab-ledger-")
    _os.close(fd)
    fd = _os.open(path, _os.O_WRONLY | _os.O_APPEND)

    def ledger_os_write(index: int) -> None:
        parsed = reported.report_index(session.report_name(index))
        _os.write(fd, f"{parsed}\n".encode())
        pre_ledger(index)

    hooks = {"ledger": session.on_report, "pre-ledger": pre_ledger, "ledger, os.write": ledger_os_write}
    out: Dict[str, Dict[str, List[float]]] = {clock: {name: [] for name in hooks} for clock in ("wall", "cpu")}
    order = list(hooks)
    try:
        for block in range(blocks + 1):  # block 0 warms up
            for name in order[block % len(order):] + order[:block % len(order)]:
                session.on_report = hooks[name]
                t0, c0 = _time.perf_counter(), _time.thread_time()
                for i in range(calls):
                    train.report({"loss": 0.5, "step": i})
                if block:
                    out["wall"][name].append(1e6 * (_time.perf_counter() - t0) / calls)
                    out["cpu"][name].append(1e6 * (_time.thread_time() - c0) / calls)
    finally:
        session.on_report = hooks["ledger"]
        _os.close(fd)
        _os.unlink(path)
    return out


def report_ab_figures(group: Any, blocks: int = AB_BLOCKS, calls: int = AB_CALLS) -> List[Figure]:
    """Figure 4d: report()'s cost with the ledger over the pre-ledger path, A/B in the same workers (each
    block paired with the pre-ledger block of the same round on the same rank), and 4e: the same for the
    ledger as first written; 4f/4g the same in the thread's CPU time (steadier where other work shares
    the machine: wall time then counts the time the rank waited for a core). The pre-ledger variant runs
    today's ``WorkerSession.report``, faster than the one of that time, so 4d overstates what the ledger
    adds to the figure before it."""
    per_rank = group.execute(report_ab, blocks, calls)
    figs = []
    for clock, key_ledger, key_old in (("wall", "4d", "4e"), ("cpu", "4f", "4g")):
        pooled: Dict[str, List[float]] = {}
        for rank, samples in enumerate(per_rank):
            for name, xs in samples[clock].items():
                pooled.setdefault(name, []).extend(xs)
                print(f"  rank {rank} report() us per call ({clock}), {name:17s}: {fmt_stats(stats(xs), digits=2)}")
        for key, name in ((key_ledger, "ledger"), (key_old, "ledger, os.write")):
            info = clock == "cpu" or name != "ledger"
            diff = [a - b for a, b in zip(pooled[name], pooled["pre-ledger"])]
            s, (lo, hi) = stats(diff), median_ci(diff)
            print(f"  report() {name} minus pre-ledger, us per call ({clock} time): {fmt_stats(s, digits=2)}; "
                  f"95% CI of median {lo:.2f}-{hi:.2f}")
            figs.append(Figure(
                key, f"{'diagnostic: ' if info else ''}report() us over pre-ledger ({name}; {clock})", s["median"],
                "us", "info" if info else "<", 3.0,
                spread=(f"95% CI of median {lo:.2f}-{hi:.2f}, IQR {s['q1']:.2f}-{s['q3']:.2f}, "
                        f"min-max {s['min']:.2f}-{s['max']:.2f}, n={s['n']} blocks of {calls}"),
                note=(f"{stats(pooled[name])['median']:.2f} vs pre-ledger {stats(pooled['pre-ledger'])['median']:.2f} "
                      f"us per call ({clock}), A/B interleaved on the same workers"),
                detail={"diff": s, "ci95": [lo, hi], "variants": {n: stats(xs) for n, xs in pooled.items()}}))
    return figs
