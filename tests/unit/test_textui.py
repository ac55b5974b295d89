"""The text fallback and the choice between widgets and text."""
from __future__ import annotations

import io

import pytest

from raytrain_nb import GroupState
from raytrain_nb.notebook import ui
from raytrain_nb.notebook.dashboard.text import TextReporter

from .fake_group import FakeGroup


def test_one_status_line_per_report_with_progress_rate_and_metrics():
    g, out = FakeGroup(), io.StringIO()
    rep = TextReporter(g, out, min_interval_s=0.0)
    rep.expect_steps(4)
    g.set_state(GroupState.RUNNING, r0="running", r1="running")
    g.report(0, {"step": 0, "loss": 0.5}, t=10.0)
    g.report(0, {"step": 1, "loss": 0.25}, t=10.5)
    lines = out.getvalue().splitlines()
    assert lines == ["raytrain_nb [rank 0]  1/4  loss=0.5", "raytrain_nb [rank 0]  2/4  2 steps/s  loss=0.25"]


def test_fast_reports_are_thinned_but_the_last_one_is_printed_when_the_cell_ends():
    g, out = FakeGroup(), io.StringIO()
    TextReporter(g, out, min_interval_s=3600.0)
    g.set_state(GroupState.RUNNING)
    for step in range(5):
        g.report(1, {"step": step}, t=float(step), total=5)
    assert out.getvalue().splitlines() == ["raytrain_nb [rank 1]  1/5"]
    g.set_state(GroupState.IDLE)
    assert out.getvalue().splitlines()[-1].startswith("raytrain_nb [rank 1]  5/5")


def test_a_dead_worker_is_reported_once_with_its_cause_and_the_way_out():
    g, out = FakeGroup(), io.StringIO()
    TextReporter(g, out)
    g.workers[1].error = "the process was killed"
    g.set_state(GroupState.FAILED, r1="dead")
    g.set_state(GroupState.FAILED)  # a later event does not repeat it
    assert out.getvalue().splitlines() == [
        "raytrain_nb [rank 1] dead: the process was killed (%dist_restart replaces it)"]


def test_ui_mode_outside_a_kernel_is_text_and_the_variable_overrides(monkeypatch):
    monkeypatch.delenv(ui.UI_ENV, raising=False)
    assert ui.ui_mode() == "text"  # pytest is no Jupyter kernel
    for mode in ("widgets", "text", "none"):
        monkeypatch.setenv(ui.UI_ENV, mode.upper())
        assert ui.ui_mode() == mode
    monkeypatch.setenv(ui.UI_ENV, "fancy")
    with pytest.raises(ValueError, match=r"RAYTRAIN_NB_UI='fancy' is unknown: use one of auto, widgets, text, none"):
        ui.ui_mode()


def test_show_in_text_mode_starts_one_reporter_per_group(capsys):
    g = FakeGroup()
    rep = ui.show(g, "text")
    assert ui.show(g, "text") is rep and ui.show(g, "none") is None
    ui.expect_steps(g, 7)
    g.set_state(GroupState.RUNNING)
    g.report(0, {"step": 0}, t=1.0)
    assert "raytrain_nb [rank 0]  1/7" in capsys.readouterr().out
