"""Section 9: the dashboard's cost and speed (``python bench/bench_dashboard.py [--quick]``).

9a. Latency from ``report()`` on a worker to the dashboard's model changing: a ``--background``
    style cell reports ``{"step": i}`` every 150 ms on 2 workers (one report per driver poll);
    an observer on rank 0's and rank 1's ``IntProgress.value`` trait takes the time the value
    changed minus the record's own ``time`` (stamped in ``report()``; same machine, same clock).
    Target: median under 300 ms.
9b. Training throughput with the dashboard open vs closed: the fixed DDP workload of
    ``workload.py`` reporting every step (the worst case for the dashboard: ~20 records per
    rank per poll and a plot re-rendered every second), in runs interleaved open/closed; a fresh
    dashboard per open run, closed after it. Target: median paired slowdown at most 3 %.
9c. (diagnostic) the driver process's CPU during those runs, open minus closed, in % of one core:
    steadier than 9b on a shared machine, and what the dashboard takes from training on 2 cores.

Runs on its own (a Ray instance and a 2-worker group of its own), or through ``run(group)``
from a suite that already has a group.
"""
from __future__ import annotations

import os
import sys
import threading
import time
from typing import Any, Dict, List

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import Figure, fmt_stats, median_ci, section, single_thread, stats  # noqa: E402

REPORTS = 120
REPORT_EVERY_S = 0.15
STEPS = 3000
ROUNDS = 8

LATENCY_CELL = """
import time, raytrain_nb as train
for _i in range({n}):
    train.report({{"step": _i}}, total={n})
    time.sleep({pause})
"""


def run_latency(group: Any, reports: int = REPORTS) -> List[Figure]:
    from raytrain_nb._internal.output import CollectSink
    from raytrain_nb.notebook.dashboard.view import Dashboard

    section(f"9a. report() -> dashboard value changed, {reports} reports per rank every {REPORT_EVERY_S * 1e3:.0f} ms")
    dash = Dashboard(group)
    lat: List[float] = []
    seen: Dict[int, int] = {}
    lock = threading.Lock()

    def observer(rank: int) -> Any:
        def on_value(change: Dict[str, Any]) -> None:
            now = time.time()
            row = dash.model.rows.get(rank)
            if row is not None and change["new"] > seen.get(rank, 0):
                with lock:
                    seen[rank] = change["new"]
                    lat.append(now - row.last_time)
        return on_value

    try:
        for rank, row in dash.rows.items():
            row.bar.observe(observer(rank), names="value")
        group.run(LATENCY_CELL.format(n=reports, pause=REPORT_EVERY_S), sink=CollectSink())
    finally:
        dash.close()
    s = stats(lat)
    p95 = sorted(lat)[int(0.95 * (len(lat) - 1))] if lat else float("nan")
    print(f"  report -> IntProgress.value: {fmt_stats(s, 1e3, 'ms', 1)}; p95 {p95 * 1e3:.1f} ms")
    return [
        Figure("9a", "report() -> dashboard value changed (median)", s["median"] * 1e3, "ms", "<", 300.0,
               spread=f"IQR {s['q1'] * 1e3:.0f}-{s['q3'] * 1e3:.0f}, p95 {p95 * 1e3:.0f}, "
                      f"max {s['max'] * 1e3:.0f} ms, n={s['n']}", detail={"latencies_s": lat}),
    ]


def run_throughput(group: Any, steps: int = STEPS, rounds: int = ROUNDS) -> List[Figure]:
    from raytrain_nb._internal.output import CollectSink
    from raytrain_nb.notebook.dashboard.view import Dashboard
    from workload import loop_cell

    section(f"9b. DDP steps/s, dashboard open vs closed, report() every step, {steps} steps x {rounds} rounds "
            "(interleaved)")
    cell = loop_cell(steps, report=True)

    def once(open_dashboard: bool) -> float:
        dash = Dashboard(group) if open_dashboard else None
        while dash is not None and dash.renders == 0:  # open: it has drawn its (empty) plot, as on screen
            threading.Event().wait(0.05)
        c0, t0 = time.process_time(), time.perf_counter()
        try:
            group.run(cell, sink=CollectSink())
            renders = dash.renders if dash is not None else 0
        finally:
            if dash is not None:
                dash.close()
        driver_cpu[("open" if open_dashboard else "closed")].append(
            100.0 * (time.process_time() - c0) / (time.perf_counter() - t0))
        if open_dashboard:
            renders_seen.append(renders)
        return steps / group.pull("elapsed", rank=0)

    renders_seen: List[int] = []
    driver_cpu: Dict[str, List[float]] = {"open": [], "closed": []}  # driver process CPU, % of one core
    once(True), once(False)  # warm-up
    renders_seen.clear()
    driver_cpu["open"].clear(), driver_cpu["closed"].clear()
    rates: Dict[str, List[float]] = {"open": [], "closed": []}
    for i in range(rounds):
        order = ("open", "closed") if i % 2 == 0 else ("closed", "open")
        for name in order:
            rates[name].append(once(name == "open"))
    ratios = [o / c for o, c in zip(rates["open"], rates["closed"])]
    slow = [100.0 * (1.0 - r) for r in ratios]
    s_open, s_closed, s_slow = stats(rates["open"]), stats(rates["closed"]), stats(slow)
    lo, hi = median_ci(slow)
    print(f"  dashboard open:   {fmt_stats(s_open, 1, 'steps/s', 1)}")
    print(f"  dashboard closed: {fmt_stats(s_closed, 1, 'steps/s', 1)}")
    print(f"  slowdown (paired): {fmt_stats(s_slow, 1, '%', 2)}; 95% CI of the median {lo:.2f}..{hi:.2f} %")
    print(f"  plot renders per open run: {renders_seen}")
    c_open, c_closed = stats(driver_cpu["open"]), stats(driver_cpu["closed"])
    print(f"  driver CPU while training: open {fmt_stats(c_open, 1, '% of a core', 1)}; "
          f"closed {fmt_stats(c_closed, 1, '% of a core', 1)}")
    return [
        Figure("9b", "DDP steps/s slowdown with the dashboard open", s_slow["median"], "%", "<", 3.0,
               spread=f"CI {lo:.2f}..{hi:.2f} %, IQR {s_slow['q1']:.2f}..{s_slow['q3']:.2f}, n={s_slow['n']}",
               note=f"open {s_open['median']:.0f} vs closed {s_closed['median']:.0f} steps/s",
               detail={"open": rates["open"], "closed": rates["closed"], "renders": renders_seen}),
        Figure("9c", "diagnostic: driver CPU added by the dashboard", c_open["median"] - c_closed["median"],
               "% of a core", "info", 3.0, spread=f"open {c_open['median']:.1f}, closed {c_closed['median']:.1f} "
               "% of a core (the driver's polling and the dashboard, both on the training machine)",
               detail=driver_cpu),
    ]


def run(group: Any = None, quick: bool = False) -> List[Figure]:
    """Figures 9a-9c, on ``group`` (a suite's) or on a 2-worker gloo group of its own."""
    if group is not None:
        return (run_latency(group, reports=40 if quick else REPORTS)
                + run_throughput(group, steps=300 if quick else STEPS, rounds=2 if quick else ROUNDS))
    single_thread()
    os.environ.setdefault("RAYTRAIN_NB_NUM_CPUS", "4")
    import torch

    torch.set_num_threads(1)
    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal.output import CollectSink
    from workload import GROUP_SETUP

    section("9. dashboard: report() to widget latency, training throughput with it open vs closed")
    own = WorkerGroup(2)
    try:
        own.run(GROUP_SETUP, sink=CollectSink())
        return run(own, quick=quick)
    finally:
        own.shutdown()


def main() -> int:
    from common import run_standalone

    return run_standalone(run, __doc__, "dashboard", "fewer repetitions (a smoke run)")


if __name__ == "__main__":
    sys.exit(main())
