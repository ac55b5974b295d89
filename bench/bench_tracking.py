"""Figures 20a-20d: what experiment tracking costs the training loop when its server is down.

20a: steps/s of the DDP loop reporting every step, on a 2-worker group, with an MLflow tracker attached whose server
is stopped (nothing listens on its port: every call the tracker makes waits in MLflow's retries, on the tracker's
own thread) against the same loop untracked, on the same workers, in windows of ``WINDOW_S`` inside one long cell:
the driver attaches a tracker for an "on" window and closes it for an "off" one, in ABBA order, while the ranks
time-stamp every step; each window's steps/s is counted from the stamps (its first ``SETTLE_S`` left out, where the
tracker starts or closes), and adjacent windows make a pair. A shared 2-core machine's speed drifts by +-15 % from
one second to the next, so whole cells as rounds (20a-cells, info) give an interval about +-4 % wide; windows
half a second apart cancel most of the drift. The figure is the slowdown at the worse end of the 95 % interval of
the median of the per-pair ratios (on / off); the target: within 2 %.
20a-cells (info): the same comparison with a cell a round (the tracker attached for an "on" cell, closed after it;
a short cell before each timed one, in both variants, takes the tracker's start).
20a' (info): the same ratio in steps per CPU second of the busier worker (what other work on a loaded machine
takes from the workers does not count). 20b (info): the driver's cost of one report handed to a tracker
(``Tracker.log_report``), server down; 20c (info): the driver's CPU a report, tracked cell minus untracked.
20d: what tracking costs in CPU per second of training, as a share of one core: the upper end of 20c's 95 % interval
(at least 20b) times the reports a second. The workers' code is the same tracked or not, so this is its whole cost,
and unlike 20a it does not depend on what else the machine runs. Target: under 2 %.
"""
from __future__ import annotations

import socket
import statistics
import time
from typing import Any, Dict, List

from common import Figure, alternate, fmt_stats, median_ci, section, stats

STEPS = 200
ROUNDS = 20
WINDOW_S = 0.5
SETTLE_S = 0.05
WINDOWED_S = 120.0  # the long cell's length (about); --quick: 10 s


def _dead_server() -> str:
    """An MLflow URL nothing listens on (a server that is stopped)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"


def _measure(group: Any, cell: str, steps: int) -> Dict[str, float]:
    """The cell's steps/s (the slower rank's wall time), steps per CPU second of the busier worker, and the
    driver's CPU seconds meanwhile (its poll and observers, and the tracker's thread)."""
    from raytrain_nb._internal.output import CollectSink

    cpu0 = time.process_time()
    group.run(cell, sink=CollectSink())
    driver_cpu = time.process_time() - cpu0
    return {"steps_per_s": steps / max(group.pull("elapsed", rank=None)),
            "steps_per_cpu_s": steps / max(group.pull("cpu_time", rank=None)), "driver_cpu_s": driver_cpu}


def run(quick: bool = False) -> List[Figure]:
    import importlib.util

    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal import cluster
    from raytrain_nb._internal.output import CollectSink
    from workload import GROUP_SETUP, loop_cell

    section("20. experiment tracking with its server down: steps/s on vs off (interleaved), a report's driver cost")
    if importlib.util.find_spec("mlflow") is None:
        print("  skipped: mlflow is not installed (pip install -e '.[mlflow]')")
        return []
    steps, rounds = (100, 3) if quick else (STEPS, ROUNDS)
    dead = _dead_server()
    cluster.connect()
    group = WorkerGroup(2)
    trackers: List[Any] = []
    try:
        group.run(GROUP_SETUP, sink=CollectSink())
        cell, warm = loop_cell(steps, report=True), loop_cell(20, report=True)

        def tracked() -> Dict[str, float]:
            tracker = group.track("mlflow", tracking_uri=dead)
            trackers.append(tracker)
            try:
                group.run(warm, sink=CollectSink())  # the tracker's start (its thread, MLflow's client) goes here
                return _measure(group, cell, steps)
            finally:
                tracker.close(wait_s=0)  # detached: the next "off" cell runs untracked

        def untracked() -> Dict[str, float]:
            group.run(warm, sink=CollectSink())  # the same short cell before, untracked
            return _measure(group, cell, steps)

        # interleaved, and in ABBA order (on off, off on, ...): what comes first in a round favours neither
        out = alternate({"on": tracked, "off": untracked}, rounds=1, warmup=1)
        for i in range(rounds - 1):
            pair = alternate({"off": untracked, "on": tracked} if i % 2 == 0 else {"on": tracked, "off": untracked},
                             rounds=1, warmup=0)
            out["on"] += pair["on"]
            out["off"] += pair["off"]
        windowed = _windowed(group, dead, 10.0 if quick else WINDOWED_S, trackers)
    finally:
        group.shutdown()
    on, off = [m["steps_per_s"] for m in out["on"]], [m["steps_per_s"] for m in out["off"]]
    ratios = [a / b for a, b in zip(on, off)]
    lo, hi = median_ci(ratios)
    s_on, s_off, s_ratio = stats(on), stats(off), stats(ratios)
    cpu_ratios = [a["steps_per_cpu_s"] / b["steps_per_cpu_s"] for a, b in zip(out["on"], out["off"])]
    cpu_lo, cpu_hi = median_ci(cpu_ratios)
    driver = [(a["driver_cpu_s"] - b["driver_cpu_s"]) / steps for a, b in zip(out["on"], out["off"])]
    pending = sum(t.log.pending for t in trackers)
    print(f"  on  {fmt_stats(s_on, unit='steps/s', digits=0)}\n  off {fmt_stats(s_off, unit='steps/s', digits=0)}")
    print(f"  on/off median {s_ratio['median']:.4f}, 95% interval {lo:.4f}-{hi:.4f}; "
          f"{pending} calls still waiting for the stopped server")
    print(f"  steps per worker CPU second, on/off median {statistics.median(cpu_ratios):.4f} (95% interval "
          f"{cpu_lo:.4f}-{cpu_hi:.4f}); the driver's CPU a report, on minus off: "
          f"{statistics.median(driver) * 1e6:.0f} us (median)")
    per_report = _driver_cost(dead, 2000 if quick else 20000)
    # CPU s a report (the upper end of 20c's 95 % interval, and never below the enqueue alone, 20b) x reports a second
    driver_hi = max(median_ci(driver)[1], per_report)
    share = 100.0 * driver_hi * s_off["median"]
    print(f"  Tracker.log_report with the server down: {per_report * 1e6:.1f} us a report on the driver")
    w_ratios = windowed["ratios"]
    w_lo, w_hi = median_ci(w_ratios)
    w_med = statistics.median(w_ratios) if w_ratios else float("nan")
    print(f"  in windows of {WINDOW_S:g} s inside one cell: on/off median {w_med:.4f}, 95% interval "
          f"{w_lo:.4f}-{w_hi:.4f} (n={len(w_ratios)} pairs; {windowed['steps']} steps)")
    return [
        Figure("20a", "steps/s slowdown, tracking on (server down) vs off", 100 * (1 - w_lo), "%", "<", 2.0,
               spread=f"on/off median {w_med:.4f} (95% CI {w_lo:.4f}-{w_hi:.4f}, n={len(w_ratios)} pairs of "
                      f"{WINDOW_S:g} s windows)",
               note=f"one cell of {windowed['steps']} DDP steps, a report each; the driver attaches and closes a "
                    "tracker window by window", detail=windowed),
        Figure("20a-cells", "diagnostic: 20a with a cell a round", 100 * (1 - lo), "%", "info", 2.0,
               spread=f"on/off median {s_ratio['median']:.4f} (95% CI {lo:.4f}-{hi:.4f}, n={len(ratios)})",
               note=f"{steps} DDP steps a cell, a report each; {s_off['median']:.0f} steps/s untracked",
               detail={"on": out["on"], "off": out["off"], "ratios": ratios}),
        Figure("20a'", "diagnostic: steps per worker CPU s, tracking on vs off", 100 * (1 - cpu_lo), "%", "info",
               2.0, spread=f"on/off median {statistics.median(cpu_ratios):.4f} (95% CI {cpu_lo:.4f}-{cpu_hi:.4f})",
               note="the workers' own CPU time: what other work on the machine takes from them does not count"),
        Figure("20c", "driver CPU a report, tracking on minus off (server down)", statistics.median(driver) * 1e6,
               "us", "info", 50.0, note="the driver's poll thread and the tracker's thread, per report"),
        Figure("20b", "driver cost of a report handed to a tracker (server down)", per_report * 1e6, "us", "info",
               50.0, note="the report's row is queued; nothing waits for the server"),
        Figure("20d", "tracking's CPU per second of training, % of one core", share, "%", "<", 2.0,
               spread=f"{driver_hi * 1e6:.1f} us a report (upper end of 20c's interval, at least 20b) x "
                      f"{s_off['median']:.0f} reports/s (untracked steps/s, a report each)",
               note="the workers run the same code tracked or not: tracking costs the CPU the driver spends on it, "
                    "taken from the workers only where they share its cores"),
    ]


def _windowed(group: Any, dead: str, seconds: float, trackers: List[Any]) -> Dict[str, Any]:
    """20a: one long cell, the tracker attached and closed window by window (ABBA), steps counted from the ranks'
    time stamps (``time.perf_counter`` is one clock for every process of a machine)."""
    import threading

    from raytrain_nb._internal.output import CollectSink
    from workload import loop_cell

    group.run("_ts = []\n" + loop_cell(20, report=True), sink=CollectSink())
    rate = 20 / max(group.pull("elapsed", rank=None))
    steps = max(200, int(rate * seconds))
    stamp = "    _ts.append(time.perf_counter())\n"
    run = group.run("_ts = []\n" + loop_cell(steps, report=True, body=stamp), sink=CollectSink(), background=True)
    pause = threading.Event()  # never set: its wait is the window's length
    windows = []
    order = ("on", "off", "off", "on")
    while not run.done():
        kind = order[len(windows) % 4]
        start = time.perf_counter()
        tracker = group.track("mlflow", tracking_uri=dead) if kind == "on" else None
        pause.wait(max(0.0, start + WINDOW_S - time.perf_counter()))
        if tracker is not None:
            trackers.append(tracker)
            tracker.close(wait_s=0)
        windows.append((kind, start, time.perf_counter()))
    run.wait(timeout=60)
    stamps = group.pull("_ts", rank=None)

    def rate_in(lo: float, hi: float) -> float:
        lo += SETTLE_S  # the tracker's start or close lands here
        counts = [sum(1 for t in ts if lo <= t < hi) for ts in stamps]
        return min(counts) / (hi - lo)  # the slower rank (DDP keeps them within a step)

    first, last = max(ts[0] for ts in stamps), min(ts[-1] for ts in stamps)
    ratios = []
    for i in range(0, len(windows) - 1, 2):  # (on off), (off on), ...: each pair one of each, side by side
        pair = windows[i:i + 2]
        if any(a < first or b > last for _, a, b in pair):
            continue  # the loop had not begun, or had ended
        rates = {kind: rate_in(a, b) for kind, a, b in pair}
        if rates["on"] > 0 and rates["off"] > 0:
            ratios.append(rates["on"] / rates["off"])
    return {"ratios": ratios, "steps": steps, "windows": len(windows)}


def _driver_cost(url: str, reports: int) -> float:
    """Seconds per ``Tracker.log_report`` of a 2-rank report, its tracker's server down."""
    import tempfile

    from raytrain_nb._internal.tracking.tracker import TrackerSpec, open_tracker

    tracker = open_tracker(TrackerSpec("mlflow", {"tracking_uri": url}), tempfile.mkdtemp(), "bench")
    metrics: List[Dict[str, Any]] = [{"loss": 0.5, "step": 1}, {"loss": 0.6, "step": 1}]
    t0 = time.perf_counter()
    for i in range(1, reports + 1):
        tracker.log_report(i, metrics)
    cost = (time.perf_counter() - t0) / reports
    tracker.close(wait_s=0)
    return cost


def main() -> int:
    from common import run_standalone

    return run_standalone(run, __doc__, "tracking", "fewer rounds (a smoke run)")


if __name__ == "__main__":
    import sys

    sys.exit(main())
