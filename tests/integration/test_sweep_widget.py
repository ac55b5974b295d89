"""The sweep dashboard on a real Ray Tune sweep: rows and the plot fill while it runs, a Stop click ends that
trial early while the others go on, and the text fallback prints a table per state change, not per result.

One sweep (2 function trainables reporting a falling loss) serves the module: it runs through
``await dash.fit(tuner)`` on a thread, as a notebook cell would await it, with two dashboards: one shown as
widgets (driven by ``Button.click()``), one as the terminal's text table.
"""
from __future__ import annotations

import asyncio
import io
import threading
import time
import types

import pytest
import ray

from ..waiting import bounded, wait_for

tune = pytest.importorskip("ray.tune")

ITERATIONS = 25
GATE_AT = 3  # every trial waits at its 4th report until the test has clicked
SCALES = [1.0, 4.0]
SWEEP_S = 180.0


class Gate:
    """A Ray actor the trials wait on (threaded: ``open`` is answered while trials wait)."""

    def __init__(self) -> None:
        self.event = threading.Event()

    def wait(self, timeout: float) -> bool:
        return self.event.wait(timeout)

    def open(self) -> None:
        self.event.set()


def descend(config, gate):
    for i in range(ITERATIONS):
        if i == GATE_AT:
            assert ray.get(gate.wait.remote(SWEEP_S), timeout=SWEEP_S + 10), "the test never opened the gate"
        time.sleep(0.05)
        tune.report({"loss": config["scale"] * 0.8 ** i + 0.01, "lr": 0.1})


@pytest.fixture(scope="module")
def swept(ray_session, tmp_path_factory):
    from raytrain_nb.tune import SweepDashboard

    dash = SweepDashboard(metric="loss", mode="min", ui="widgets", plot_interval_s=0.3)
    out = io.StringIO()
    text = SweepDashboard(stream=out)  # pytest is no kernel: the text fallback, as in a terminal
    gate = ray.remote(num_cpus=0, max_concurrency=4)(Gate).remote()
    tuner = tune.Tuner(tune.with_parameters(descend, gate=gate), param_space={"scale": tune.grid_search(SCALES)},
                       tune_config=tune.TuneConfig(max_concurrent_trials=len(SCALES)),
                       run_config=tune.RunConfig(name="sweep", storage_path=str(tmp_path_factory.mktemp("tune")),
                                                 callbacks=[dash, text], stop=dash.stopper, verbose=0))
    box = {}

    def run():
        try:
            box["results"] = asyncio.run(dash.fit(tuner))
        except BaseException as exc:  # noqa: BLE001 - shown by the assertions below
            box["error"] = exc

    thread = threading.Thread(target=run, name="test-sweep", daemon=True)  # as a cell awaits it
    thread.start()
    view = wait_for(lambda: dash.view, 60, "the widget to be built")

    def running_trial():
        # a trial at the gate: Tune asked the stopper about every result its row shows, and none is in flight, so
        # the report after the click is the gate's (at two results shown, a third in flight could take the stop)
        return next((tid for tid, row in view.rows.items()
                     if "RUNNING" in row.state.value and int(row.iterations.value or 0) == GATE_AT), None)

    try:
        victim = wait_for(lambda: running_trial() or (None if thread.is_alive() else "ended"), SWEEP_S,
                          "a trial waiting at the gate, its results shown in its row")
        assert victim != "ended", f"the sweep ended before a trial reached the gate: {box}"
        during = types.SimpleNamespace(rows=len(view.rows), iterations=int(view.rows[victim].iterations.value),
                                       stop_tooltip=view.rows[victim].stop.tooltip, text_stop=None)
        with pytest.raises(RuntimeError, match="stop=dash.stopper") as info:
            text.stop(victim)  # Tune never asks the text dashboard's own stopper
        during.text_stop = str(info.value)
        view.rows[victim].stop.click()
        during.status = view.status.value
        during.again = view.press(victim)
    finally:
        ray.get(gate.open.remote(), timeout=60)
    bounded(SWEEP_S, "the sweep", lambda: thread.join(SWEEP_S))
    assert not thread.is_alive() and "results" in box, box
    return types.SimpleNamespace(dash=dash, view=view, text=text, out=out.getvalue(), victim=victim,
                                 during=during, results=box["results"])


def test_rows_fill_while_the_sweep_runs_and_a_stop_click_ends_only_that_trial(swept):
    view, model, victim = swept.view, swept.dash.model, swept.victim
    assert swept.during.iterations == GATE_AT and "next report" in swept.during.stop_tooltip
    assert f"stopping trial {victim}" in swept.during.status
    assert "cannot act now: stopping" in swept.during.again
    rows = {r.metrics["trial_id"]: r for r in swept.results}
    assert set(rows) == set(model.rows) and len(rows) == len(SCALES)
    stopped = model.rows[victim]
    assert stopped.state == "TERMINATED" and stopped.ended_by == "button"
    assert stopped.iterations == GATE_AT + 1 and rows[victim].metrics["training_iteration"] == stopped.iterations
    assert model.ended_text(stopped) == "stopped early (Stop)"
    others = [r for tid, r in model.rows.items() if tid != victim]
    assert all(r.state == "TERMINATED" and r.iterations == ITERATIONS and r.ended_by == "finished" for r in others)
    row = view.rows[victim]
    assert "TERMINATED" in row.state.value and row.iterations.value == str(stopped.iterations)
    assert row.ended.value == "stopped early (Stop)" and row.stop.disabled
    assert view.stop_sweep.disabled and "no sweep is running" in view.stop_sweep.tooltip


def test_each_row_shows_params_latest_and_best_and_the_best_trial_is_marked(swept):
    view, model = swept.view, swept.dash.model
    best = model.best_trial()
    latest = {tid: r.latest for tid, r in model.rows.items()}
    assert best == min(latest, key=latest.get)
    for tid, row in model.rows.items():
        widgets = view.rows[tid]
        assert f"scale={row.params['scale']:.4g}" in widgets.params.value
        assert widgets.latest.value == f"{row.latest:.4g}" and widgets.best.value == f"{row.best:.4g}"
        assert ("★" in widgets.trial.value) == (tid == best)
        assert ("rtnb-trial-best" in widgets.box._dom_classes) == (tid == best)
    assert "best loss=" in view.title.value and "ended" in view.title.value


def test_every_curve_is_on_one_log_plot_with_the_best_drawn_thick_on_top(swept):
    view, model = swept.view, swept.dash.model
    assert bytes(view.image.value).startswith(b"\x89PNG") and view.renders >= 2
    lines, best = model.lines()
    assert [ln.label for ln in lines][-1] == best and {ln.label for ln in lines} == set(model.rows)
    assert view.plot.axes.get_yscale() == "log" and view.plot.axes.get_xlabel() == "training_iteration"
    widths = {label: line.get_linewidth() for label, line in view.plot._lines.items()}
    assert widths[best] > max(w for label, w in widths.items() if label != best)


def test_the_text_fallback_prints_a_table_per_state_change_not_per_result(swept):
    out, text = swept.out, swept.text
    assert out.startswith("(Tune prints its own progress as well")
    tables = out.count("raytrain_nb sweep · ")
    assert tables == text.text.tables and 2 <= tables <= 2 * len(SCALES) + 1  # starts, ends, the final one
    last = out[out.rindex("raytrain_nb sweep · "):].splitlines()
    n = len(SCALES)
    assert last[0].startswith(f"raytrain_nb sweep · {n} trials: {n} terminated · best loss=")
    assert last[1].split() == ["trial", "state", "iter", "loss", "best", "loss", "ended", "params"]
    by_id = {line.split()[0]: line for line in last[2:]}
    assert set(by_id) >= set(swept.dash.model.rows) - {swept.dash.model.best_trial()}
    assert "stopped early" in by_id[swept.victim] and "scale=" in by_id[swept.victim]
    assert "stop=dash.stopper" in swept.during.text_stop
