"""The sweep dashboard without Tune or a front end: the model's rules, the text table, the stopper, the
buttons' states and actions, the widget fed by hand, and ``await dash.fit`` on Ctrl-C (a fake tuner)."""
from __future__ import annotations

import asyncio
import io
import pickle
import threading

import pytest

from raytrain_nb.notebook.sweep.actions import act
from raytrain_nb.notebook.sweep.model import (FOREGROUND_WHY, NOT_WIRED_WHY, StopSituation, SweepModel, format_params,
                                              stop_state, sweep_stop_state)
from raytrain_nb.notebook.sweep.text import SweepText, table

pytest.importorskip("ray.tune")

from raytrain_nb.notebook.sweep.stopper import DashboardStopper  # noqa: E402


def _result(i, **metrics):
    return {"training_iteration": i, "time_this_iter_s": 0.1, "done": False, "trial_id": "x", **metrics}


def _sweep(mode="min", scope="last", metric="loss"):
    m = SweepModel(metric, mode if metric else None, scope)
    m.begin()
    for tid, scale in (("t0", 1.0), ("t1", 2.0), ("t2", 4.0)):
        m.see(tid, "PENDING", name=f"fn_{tid}", params={"scale": scale})
    return m


# -- the model -----------------------------------------------------------------------------------


def test_latest_and_best_follow_the_mode_and_the_best_trial_follows_the_scope():
    m = _sweep()
    m.start("t0")
    m.start("t1")
    for i, (a, b) in enumerate([(0.9, 0.5), (0.4, 0.6), (0.7, 0.55)], start=1):
        m.add_result("t0", _result(i, loss=a))
        m.add_result("t1", _result(i, loss=b))
    t0, t1 = m.rows["t0"], m.rows["t1"]
    assert (t0.iterations, t0.latest, t0.best) == (3, 0.7, 0.4) and (t1.latest, t1.best) == (0.55, 0.5)
    assert m.best_trial() == "t1"  # scope last, as get_best_result(): 0.55 < 0.7
    m.scope = "all"
    assert m.best_trial() == "t0"  # its best, 0.4, beats t1's 0.5
    mx = _sweep(mode="max")
    mx.add_result("t0", _result(1, loss=0.9))
    mx.add_result("t1", _result(1, loss=0.5))
    mx.add_result("t0", _result(2, loss=0.2))
    assert mx.rows["t0"].best == 0.9 and mx.best_trial() == "t1"


def test_the_metric_is_loss_else_the_first_number_and_tunes_own_keys_are_no_metrics():
    m = _sweep(metric=None)
    m.add_result("t0", _result(1, acc=0.5, loss=2.0, name="x", flag=True))
    assert m.metric == "loss" and m.mode == "min"
    n = _sweep(metric=None)
    n.add_result("t0", {"training_iteration": 1, "time_total_s": 3.0, "acc": 0.5, "note": "text"})
    assert n.metric == "acc" and n.rows["t0"].latest == 0.5
    assert set(n.rows["t0"].points[0][1]) == {"acc"}
    n.begin()
    assert n.metric is None and not n.rows  # a new sweep infers again


def test_bad_options_fail_in_one_line_naming_the_fix():
    with pytest.raises(ValueError, match="mode='min' or mode='max'"):
        SweepModel("acc")
    with pytest.raises(ValueError, match="mode='avg' is unknown"):
        SweepModel("acc", "avg")
    with pytest.raises(ValueError, match="scope='best' is unknown"):
        SweepModel(scope="best")


def test_how_a_trial_ended_and_whether_that_was_early():
    m = _sweep()
    for tid in ("t0", "t1", "t2"):
        m.start(tid)
    for i in range(1, 9):
        m.add_result("t0", _result(i, loss=1 / i), stopped_by="tune" if i == 8 else "")
    m.add_result("t1", _result(1, loss=1.0))
    m.add_result("t1", _result(2, loss=0.9), stopped_by="tune")
    m.add_result("t2", _result(1, loss=2.0), stopped_by="button")
    for tid in ("t0", "t1", "t2"):
        m.complete(tid)
    assert m.ended_text(m.rows["t0"]) == "stopped by Tune"  # ASHA's max_t: the longest trial is not early
    assert m.ended_text(m.rows["t1"]) == "stopped early" and m.stopped_early(m.rows["t1"])
    assert m.ended_text(m.rows["t2"]) == "stopped early (Stop)"
    f = _sweep()
    f.start("t0")
    f.add_result("t0", _result(1, loss=1.0))
    f.complete("t0")
    f.fail("t1", "the trial raised: see /x/error.txt")
    assert f.ended_text(f.rows["t0"]) == "finished" and f.ended_text(f.rows["t1"]) == "error"
    f.request_stop_all()
    assert f.see("t2", "TERMINATED") and f.ended_text(f.rows["t2"]) == "not run (Stop sweep)"


def test_state_changes_bump_the_state_version_and_results_only_the_version():
    m = _sweep()
    before = (m.version, m.state_version)
    m.add_result("t0", _result(1, loss=1.0))
    assert m.version > before[0] and m.state_version == before[1]
    assert m.rows["t0"].state == "RUNNING"  # a result means it runs, whatever Tune said before
    assert not m.see("t0", "RUNNING") and m.see("t0", "PAUSED") and m.state_version == before[1] + 1


def test_points_are_thinned_not_dropped_and_the_best_curve_is_drawn_last():
    m = SweepModel("loss", "min", max_points=10, plot_points=4)
    m.begin()
    for i in range(1, 40):
        m.add_result("a", _result(i, loss=1.0 / i))
        m.add_result("b", _result(i, loss=2.0 / i))
    assert len(m.rows["a"].points) <= 10 and m.rows["a"].points[0][0] == 1.0
    lines, best = m.lines()
    assert best == "a" and [ln.label for ln in lines] == ["b", "a"]
    assert len(lines[1].xs) <= 5 and lines[1].xs[-1] == 39.0


def test_summary_counts_states_and_names_the_best():
    m = _sweep()
    m.start("t0")
    m.add_result("t0", _result(1, loss=0.01234))
    assert m.summary() == "3 trials: 1 running, 2 pending · best loss=0.01234 (trial t0)"
    assert format_params({"lr": 0.000123456, "opt": "adam"}) == "lr=0.0001235 opt=adam"
    assert format_params({"a": "x" * 100}, limit=10) == "a=xxxxxxx…"


# -- the buttons' states ---------------------------------------------------------------------------


def test_a_stop_button_acts_only_on_a_live_trial_of_a_running_wired_sweep_the_kernel_can_hear():
    m = _sweep()
    m.start("t0")
    row, pending = m.rows["t0"], m.rows["t1"]
    assert stop_state(m, row, StopSituation(running=True, wired=True)) == (
        True, "stop this trial at its next report (the others go on)")
    assert stop_state(m, pending, StopSituation(running=True))[0]  # wiring not known yet: allowed
    assert "first report" in stop_state(m, pending, StopSituation(running=True))[1]
    assert stop_state(m, row, StopSituation(running=False)) == (False, "no sweep is running")
    assert stop_state(m, row, StopSituation(running=True, clicks_now=False)) == (False, FOREGROUND_WHY)
    assert stop_state(m, row, StopSituation(running=True, wired=False)) == (False, NOT_WIRED_WHY)
    assert "await dash.fit(tuner)" in FOREGROUND_WHY and "stop=dash.stopper" in NOT_WIRED_WHY
    m.request_stop("t0")
    assert stop_state(m, row, StopSituation(running=True)) == (False, "stopping: Tune stops it at its next report")
    m.add_result("t0", _result(1, loss=1.0), stopped_by="button")
    m.complete("t0")
    assert stop_state(m, row, StopSituation(running=True)) == (False, "the trial ended (stopped early (Stop))")
    assert sweep_stop_state(m, StopSituation(running=True))[0]
    m.request_stop_all()
    assert sweep_stop_state(m, StopSituation(running=True)) == (
        False, "stopping: Tune ends every trial and starts no new one")


# -- the stopper and the actions -------------------------------------------------------------------


def test_the_stopper_ends_requested_trials_at_their_next_result_and_the_sweep_on_request():
    s = DashboardStopper()
    assert s("a", {}) is False and s.was_asked("a") and not s.was_asked("b")
    s.request("a")
    assert s("a", {}) and not s("b", {}) and s.stopped("a") and not s.stopped("b")
    assert not s.stop_all()
    s.request_all()
    assert s.stop_all() and s("b", {})
    copy = pickle.loads(pickle.dumps(s))  # Tune pickles its RunConfig with the Tuner
    assert copy.stop_all() and copy("a", {})
    s.reset()
    assert not s.stop_all() and not s("a", {}) and not s.was_asked("b")


def test_actions_call_the_stopper_once_and_say_what_happens():
    m, s = _sweep(), DashboardStopper()
    assert act(m, s, "t1") == "stopping trial t1: Tune ends it at its next report; the others go on"
    assert s("t1", {}) and m.rows["t1"].stop_requested and not s("t0", {})
    with pytest.raises(ValueError, match="no trial 'zz' in this sweep \\(trials: t0, t1, t2\\)"):
        act(m, s, "zz")
    assert "stopping the sweep" in act(m, s, None) and s.stop_all() and m.stop_all_requested


# -- the text fallback -----------------------------------------------------------------------------


def test_the_text_table_prints_on_state_changes_only():
    m, out = _sweep(), io.StringIO()
    text = SweepText(m, out, note="(a note)")
    text.start()
    assert not text.update()  # three pending trials: nothing to list yet
    m.start("t0")
    assert text.update() and not text.update()
    for i in range(1, 20):
        m.add_result("t0", _result(i, loss=1.0 / i))
        assert not text.update()  # results never print
    m.complete("t0")
    assert text.update()
    text.finish()
    lines = out.getvalue().splitlines()
    assert lines[0] == "(a note)" and text.tables == 3
    assert lines[-3] == "raytrain_nb sweep · 3 trials: 2 pending, 1 terminated · best loss=0.05263 (trial t0)"
    assert lines[-2].split() == ["trial", "state", "iter", "loss", "best", "loss", "ended", "params"]
    assert lines[-1].split() == ["t0", "*", "TERMINATED", "19", "0.05263", "0.05263", "finished", "scale=1"]


def test_a_long_table_keeps_running_changed_and_best_trials():
    m = SweepModel("loss", "min")
    m.begin()
    for i in range(20):
        m.start(f"t{i:02d}")
        m.add_result(f"t{i:02d}", _result(1, loss=1.0 + i))
        if i < 15:
            m.complete(f"t{i:02d}")
    lines = table(m, changed=["t14"], max_rows=8)
    listed = [ln.split()[0] for ln in lines[2:-1]]
    assert len(listed) == 8 and {"t00", "t14", "t15", "t19"} <= set(listed)
    assert lines[-1] == "  … 12 more trial(s) not listed"


# -- the widget, fed by hand -----------------------------------------------------------------------


def test_the_widget_follows_the_model_and_its_buttons_act_through_the_stopper():
    pytest.importorskip("ipywidgets")
    from raytrain_nb.notebook.sweep.view import SweepView

    m, s = _sweep(), DashboardStopper()
    situation = StopSituation(running=True, wired=True)
    view = SweepView(m, s, lambda: situation)
    m.start("t0")
    m.add_result("t0", _result(1, loss=0.5))
    view.refresh()
    assert list(view.rows) == ["t0", "t1", "t2"] and view.rows["t0"].iterations.value == "1"
    assert "★" in view.rows["t0"].trial.value and not view.rows["t0"].stop.disabled
    view.rows["t0"].stop.click()
    assert s("t0", {}) and view.rows["t0"].stop.disabled and "stopping trial t0" in view.status.value
    situation.clicks_now = False
    view.refresh()
    assert view.rows["t1"].stop.disabled and view.rows["t1"].stop.tooltip == FOREGROUND_WHY
    view.stop_sweep.click()
    assert not s.stop_all() and "cannot act now" in view.status.value
    assert view.render(force=True) and bytes(view.image.value).startswith(b"\x89PNG")


# -- await dash.fit(tuner), Ctrl-C -----------------------------------------------------------------


class _FakeTuner:
    """``fit()`` runs until its stopper says stop all, then returns what it has (as Tune does)."""

    def __init__(self, stopper: DashboardStopper) -> None:
        self.stopper = stopper
        self.started = threading.Event()

    def fit(self):
        self.started.set()
        for _ in range(600):
            if self.stopper.stop_all():
                return "results so far"
            threading.Event().wait(0.01)
        raise AssertionError("the fake sweep was never stopped")


def test_ctrl_c_while_awaiting_fit_stops_every_trial_and_returns_the_results(monkeypatch):
    from raytrain_nb.notebook.sweep import SweepDashboard

    dash = SweepDashboard(ui="none")
    tuner = _FakeTuner(dash.stopper)

    async def cell():
        task = asyncio.ensure_future(dash.fit(tuner))
        await asyncio.get_running_loop().run_in_executor(None, tuner.started.wait, 10)
        task.cancel()  # what the kernel's interrupt does to an awaiting cell
        return await task

    assert asyncio.run(cell()) == "results so far" and dash.stopper.stop_all()
    assert pickle.loads(pickle.dumps(dash)).ui == "none"  # Tune pickles its RunConfig with the Tuner
    with pytest.raises(RuntimeError, match="no sweep is running"):
        dash.stop()
    with pytest.raises(ValueError, match="ui='web' is unknown: use 'widgets', 'text', 'none' or None"):
        SweepDashboard(ui="web")


def test_the_plot_draws_the_highlighted_line_thick_and_drops_the_legend_past_a_dozen_lines():
    pytest.importorskip("matplotlib")
    from raytrain_nb.notebook.dashboard.model import Line
    from raytrain_nb.notebook.dashboard.plot import MAX_LEGEND, MetricsPlot

    plot = MetricsPlot()
    lines = [Line(f"t{i}", [1, 2], [1.0 + i, 0.5 + i]) for i in range(3)]
    plot.render(lines, "loss", log=True, highlight="t0", xlabel="training_iteration")
    widths = {label: line.get_linewidth() for label, line in plot._lines.items()}
    assert widths["t0"] > widths["t1"] == widths["t2"] and plot.axes.get_xlabel() == "training_iteration"
    assert plot.axes.get_title() == "loss per training_iteration (log scale)"
    many = [Line(f"t{i}", [1, 2], [1.0, 0.5]) for i in range(MAX_LEGEND + 1)]
    plot.render(many, "loss", highlight=None)
    assert plot.axes.get_legend() is None and {ln.get_linewidth() for ln in plot._lines.values()} == {1.4}
