"""Section 13: the sweep dashboard's cost (``python bench/bench_tune_widget.py [--quick]``).

Tune's events are replayed without Ray (a sweep of ``TRIALS`` trials, each reporting ``RESULTS`` results as
fast as the hooks take them, with a state sync per step as Tune's loop does), so the figures are the
dashboard's own, not Tune's or the machine's scheduling of trial actors.

13a. Time in the callback per result, on the thread that runs Tune's loop (``on_trial_result`` plus one
     ``on_step_end``), with the widget's timer thread drawing meanwhile. Target: under 0.5 ms (Tune warns
     when its own result processing passes 500 ms; this is 1/1000 of that).
13b. Widget state messages sent to the front end per second during that sweep, replayed at 800 results/s
     (a step of 8 results every 10 ms), after its first second (when the rows are built): the rows follow
     at most twice a second and the plot once, not per result. Target: under 60 messages/s.
13c. One plot frame of 8 trials x 500 points (log scale, the best highlighted), in ms (diagnostic).
13d. The text fallback: tables printed for the whole sweep, against the results (diagnostic: one table
     per state change, never per result).
"""
from __future__ import annotations

import io
import os
import sys
import time
from typing import Any, Dict, List

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import Figure, fmt_stats, section, single_thread, stats  # noqa: E402

TRIALS = 8
RESULTS = 500
PACE_S = 0.01  # a step of 8 results every 10 ms: 800 results/s, a fast sweep


class FakeTrial:
    """What the callback reads of a Tune ``Trial``."""

    def __init__(self, i: int) -> None:
        self.trial_id = f"bench_{i:05d}"
        self.status = "PENDING"
        self.evaluated_params = {"lr": 10 ** -(1 + i % 4), "batch": 32 * (1 + i % 3)}
        self.error_file = None

    def __str__(self) -> str:
        return f"train_fn_{self.trial_id}"


def _sweep(dash: Any, results: int, pace_s: float = 0.0, count: Any = None) -> Dict[str, Any]:
    """Replay one sweep into ``dash`` (a step of results every ``pace_s``); returns per-result hook times,
    the results/s and, with ``count`` (a callable giving the messages sent so far), those sent per second
    in the steady part (after the first second: the rows are built then)."""
    trials = [FakeTrial(i) for i in range(TRIALS)]
    dash.setup(stop={}, num_samples=TRIALS, total_num_samples=TRIALS)
    per_result: List[float] = []
    t_start = time.perf_counter()
    marks = []
    for step in range(results):
        if pace_s:
            time.sleep(pace_s)
        if count is not None:
            marks.append((time.perf_counter() - t_start, count()))
        for n, trial in enumerate(trials):
            if step == 0:
                dash.on_trial_start(iteration=step, trials=trials, trial=trial)
                trial.status = "RUNNING"
            result = {"loss": (1 + n) * 0.99 ** step, "training_iteration": step + 1, "done": False,
                      "time_this_iter_s": 0.01, "trial_id": trial.trial_id}
            t = time.perf_counter()
            dash.stopper(trial.trial_id, result)  # Tune asks its stopper first
            dash.on_trial_result(iteration=step, trials=trials, trial=trial, result=result)
            dash.on_step_end(iteration=step, trials=trials)
            per_result.append(time.perf_counter() - t)
    for trial in trials:
        dash.on_trial_complete(iteration=results, trials=trials, trial=trial)
        trial.status = "TERMINATED"
    wall = time.perf_counter() - t_start
    dash.on_step_end(iteration=results, trials=trials)
    dash.on_experiment_end(trials=trials)
    steady = [(t, n) for t, n in marks if t >= 1.0]
    rate = (steady[-1][1] - steady[0][1]) / (steady[-1][0] - steady[0][0]) if len(steady) > 1 else None
    return {"per_result": per_result, "wall": wall, "results_per_s": len(per_result) / wall, "messages_per_s": rate}


def run(quick: bool = False) -> List[Figure]:
    single_thread()
    import ipywidgets

    from raytrain_nb.notebook.dashboard.model import Line
    from raytrain_nb.notebook.dashboard.plot import MetricsPlot
    from raytrain_nb.tune import SweepDashboard

    results = 200 if quick else RESULTS
    section(f"13. sweep dashboard: {TRIALS} trials x {results} results replayed as fast as the hooks allow")
    sent = {"n": 0}
    original = ipywidgets.Widget.send_state

    def counting(self: Any, key: Any = None) -> None:
        sent["n"] += 1
        original(self, key)

    ipywidgets.Widget.send_state = counting
    try:
        dash = SweepDashboard(metric="loss", mode="min", ui="widgets")
        dash.show = lambda: dash.view  # no display() outside a kernel
        widget = _sweep(dash, results, PACE_S, lambda: sent["n"])
        messages = sent["n"]
    finally:
        ipywidgets.Widget.send_state = original
    hook = stats(widget["per_result"])
    rate = widget["messages_per_s"]
    print(f"  callback per result: {fmt_stats(hook, 1e3, 'ms', 3)}")
    print(f"  {widget['results_per_s']:.0f} results/s handled; {messages} widget messages in {widget['wall']:.1f} s "
          f"({rate:.1f}/s after the first second); plot frames drawn: {dash.view.renders}")

    plot = MetricsPlot()
    lines = [Line(f"t{i}", list(range(1, 501)), [(1 + i) * 0.99 ** s for s in range(500)]) for i in range(TRIALS)]
    frames = []
    for k in range(3 if quick else 10):
        t = time.perf_counter()
        plot.render(lines, "loss", log=True, highlight="t0", xlabel="training_iteration")
        frames.append(time.perf_counter() - t)
    frame = stats(frames[1:] or frames)  # the first frame draws the axes too
    print(f"  plot frame, {TRIALS} lines x 500 points: {fmt_stats(frame, 1e3, 'ms', 1)} (first {frames[0] * 1e3:.0f} ms)")

    out = io.StringIO()
    text = SweepDashboard(metric="loss", mode="min", ui="text", stream=out)
    text_run = _sweep(text, results)
    tables = text.text.tables
    print(f"  text fallback: {tables} tables for {len(text_run['per_result'])} results")
    return [
        Figure("13a", "sweep dashboard: callback time per result (Tune's thread)", hook["median"] * 1e3, "ms", "<", 0.5,
               spread=fmt_stats(hook, 1e3, "ms", 3), note=f"{widget['results_per_s']:.0f} results/s replayed"),
        Figure("13b", "sweep dashboard: widget messages per second", rate, "/s", "<", 60.0,
               spread=f"{messages} messages for {len(widget['per_result'])} results",
               note=f"{widget['results_per_s']:.0f} results/s; {dash.view.renders} plot frames"),
        Figure("13c", "sweep plot frame, 8 trials x 500 points", frame["median"] * 1e3, "ms", "info", 60.0,
               spread=fmt_stats(frame, 1e3, "ms", 1), note=f"first frame (axes) {frames[0] * 1e3:.0f} ms"),
        Figure("13d", "text fallback: tables per sweep", float(tables), "", "info", 2 * TRIALS + 1,
               note=f"for {len(text_run['per_result'])} results and {TRIALS} trials"),
    ]


def main() -> int:
    from common import run_standalone

    return run_standalone(run, __doc__, "tune_widget", "fewer results (a smoke run)")


if __name__ == "__main__":
    sys.exit(main())
