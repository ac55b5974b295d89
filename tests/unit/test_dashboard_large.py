"""A large group on the dashboard and in the text form: a summary, rows only where needed, a band, few messages."""
from __future__ import annotations

import io
import time

import ipywidgets
import pytest

from raytrain_nb import GroupState
from raytrain_nb.notebook.dashboard.bands import Bands
from raytrain_nb.notebook.dashboard.model import DashboardModel, Line, RankView
from raytrain_nb.notebook.dashboard.plot import MetricsPlot
from raytrain_nb.notebook.dashboard.summary import parse_ranks, shown_ranks, summarize
from raytrain_nb.notebook.dashboard.text import TextReporter
from raytrain_nb.notebook.dashboard.view import MAX_MESSAGES_PER_S, Dashboard
from raytrain_nb.notebook.ratecap import MessageBudget

from .fake_group import FakeGroup
from .test_dashboard_sync import Clock


def _views(n, **by_rank):
    views = {r: RankView(rank=r, state="running", rate=10.0 + r, reports=5, step=4.0) for r in range(n)}
    for rank, changes in by_rank.items():
        for key, value in changes.items():
            setattr(views[int(rank[1:])], key, value)
    return views


def test_the_summary_counts_states_names_extremes_and_lists_broken_ranks_before_slow_ones():
    views = _views(64, r5={"state": "dead"}, r9={"slow": True, "rate": 0.5}, r40={"state": "failed"},
                   r63={"rate": 500.0})
    s = summarize(views)
    assert s.counts == (("running", 62), ("failed", 1), ("dead", 1)) and s.total == 64
    assert [r for r, _ in s.slowest] == [9, 0, 1] and [r for r, _ in s.fastest] == [63, 62, 61]
    assert s.listed == (5, 40, 9) and s.unlisted == 0 and s.done == (5, 5)
    assert s.text().startswith("64 workers: 62 running, 1 failed, 1 dead · steps 5 · slowest 9 (0.5/s)")
    assert "fastest 63 (500/s)" in s.text() and s.text().endswith("look at 5, 40, 9")
    many = summarize(_views(64, **{f"r{r}": {"state": "dead"} for r in range(20)}))
    assert len(many.listed) == 16 and many.unlisted == 4 and "and 4 more" in many.text()


def test_rows_for_every_rank_of_a_small_group_and_for_listed_and_expanded_ranks_of_a_large_one():
    assert shown_ranks(_views(16, r3={"state": "dead"})) == list(range(16))
    assert shown_ranks(_views(17, r3={"state": "dead"}), expanded=[8, 9, 99]) == [3, 8, 9]


def test_ranks_to_expand_are_parsed_and_bad_ones_refused_in_one_line():
    assert parse_ranks("8-11, 2", 64) == [2, 8, 9, 10, 11] and parse_ranks("", 64) == []
    with pytest.raises(ValueError, match=r"ranks 'a-b': give ranks as 'FIRST-LAST'.*'8-15'"):
        parse_ranks("a-b", 64)
    with pytest.raises(ValueError, match=r"ranks '60-70': 60-70 is not a range within 0-63 \(the group has 64"):
        parse_ranks("60-70", 64)
    with pytest.raises(ValueError, match=r"ranks '0-63': 64 ranks at once; expand at most 32 \(such as '0-31'\)"):
        parse_ranks("0-63", 64)


def test_bands_keep_mean_min_max_per_step_thinned_and_sampled():
    bands = Bands(max_points=10)
    for x in range(30):
        for rank in range(4):
            bands.add(float(x), {"loss": float(rank + x)})
    assert len(bands.steps["loss"]) <= 10
    line = bands.line("loss", 4, plot_points=4)
    assert line.xs[-1] == 29.0 and len(line.xs) <= 5
    assert (line.ys[-1], line.lo[-1], line.hi[-1]) == (30.5, 29.0, 32.0)


def test_a_large_group_is_plotted_as_a_mean_with_a_band_and_keeps_fewer_points_per_rank():
    model = DashboardModel(max_points=4000)
    model.set_workers(FakeGroup(256).workers)
    model.add_records([{"rank": r, "time": 1.0 + s, "metrics": {"step": s, "loss": 1.0 + r / 256}}
                       for s in range(3) for r in range(256)])
    (line,) = model.lines("loss")
    assert line.label == "mean of 256 ranks (band: min-max)" and line.lo[0] == 1.0 and line.hi[0] == 1 + 255 / 256
    assert model.series[0].max_points == 250
    small = DashboardModel()
    small.add_records([{"rank": r, "time": 1.0, "metrics": {"step": 0, "loss": 1.0}} for r in range(4)])
    assert [ln.label for ln in small.lines("loss")] == [f"rank {r}" for r in range(4)]


def test_the_plot_draws_a_band_under_the_mean_line():
    plot = MetricsPlot()
    bare = plot.render([Line("mean of 64 ranks", [0, 1, 2], [1.0, 0.8, 0.7])], "loss")
    banded = MetricsPlot().render([Line("mean of 64 ranks", [0, 1, 2], [1.0, 0.8, 0.7], lo=[0.5, 0.4, 0.3],
                                        hi=[1.5, 1.2, 1.1])], "loss")
    assert banded.startswith(b"\x89PNG") and banded != bare
    assert [t.get_text() for t in plot.axes.get_legend().get_texts()] == ["mean of 64 ranks"]


@pytest.fixture
def sent(monkeypatch):
    out = []
    original = ipywidgets.Widget._send

    def counting(widget, msg, buffers=None):
        out.append(msg)
        return original(widget, msg, buffers=buffers)

    monkeypatch.setattr(ipywidgets.Widget, "_send", counting)
    return out


def test_a_dashboard_of_64_ranks_shows_a_summary_and_expands_a_range(sent):
    g = FakeGroup(64)
    dash = Dashboard(g, timer=False)
    try:
        assert dash.large.box.layout.display is None and list(dash.rows) == []
        assert "64 ranks" in dash.large.line.value and "64 idle" in dash.large.line.value
        g.workers[7].error = "killed"
        g.set_state(GroupState.FAILED, r7="dead")
        dash.flush()
        assert list(dash.rows) == [7] and "1 dead" in dash.large.line.value
        dash.large.ranks.value = "8-11"
        dash.large.expand_button.click()
        assert sorted(dash.rows) == [7, 8, 9, 10, 11]
        dash.large.ranks.value = "60-99"
        dash.large.expand_button.click()
        assert "not a range within 0-63" in dash.large.note.value and sorted(dash.rows) == [7, 8, 9, 10, 11]
        dash.large.collapse_button.click()
        assert list(dash.rows) == [7]
    finally:
        dash.close()
    small = Dashboard(FakeGroup(2), timer=False)
    assert small.large.box.layout.display == "none" and sorted(small.rows) == [0, 1]
    small.close()


@pytest.mark.parametrize("n", [2, 16, 64])
def test_widget_messages_stay_under_the_budget_whatever_the_group_size(sent, n):
    """Every rank reports 10 times a second for 10 s (on a hand-moved clock); the timer ticks every 10 ms.

    Without the budget 16 ranks send ~230 messages a second (a bar and text cells per row, ten flushes a second).
    """
    clock, seconds, per_s = Clock(), 10.0, 10
    g = FakeGroup(n)
    dash = Dashboard(g, clock=clock, timer=False, plot_interval_s=1.0)
    try:
        g.set_state(GroupState.RUNNING, **{f"r{r}": "running" for r in range(n)})
        sent.clear()
        start = clock.now
        for tick in range(int(seconds * 100)):
            clock.now = start + tick / 100
            if tick % (100 // per_s) == 0:
                for rank in range(n):
                    g.report(rank, {"step": tick // 10, "loss": 1.0 / (tick + 1)}, t=clock.now, total=100)
            dash.tick()
        # the budget's burst and one flush's overdraft on top of the rate
        assert len(sent) <= MAX_MESSAGES_PER_S * (seconds + 2), f"{len(sent)} messages in {seconds:g} s at N={n}"
        assert len(sent) >= 2 * seconds, "the dashboard still moves"
        g.set_state(GroupState.IDLE, **{f"r{r}": "idle" for r in range(n)})
        clock.now += 5.0
        dash.tick()
        shown = dash.rows[0] if n <= 16 else None
        assert shown is None or shown.done.value == "100/100"
        assert n <= 16 or "steps 100/100" in dash.large.line.value
    finally:
        dash.close()


def test_the_message_budget_lets_a_burst_through_then_paces():
    clock = Clock()
    budget = MessageBudget(50, clock=clock)
    assert budget.ready_at() == clock.now
    budget.spend(75)  # a burst of 50, overdrawn by 25: the next update waits 0.5 s
    assert budget.ready_at() == pytest.approx(clock.now + 0.5)
    clock.now += 0.5
    assert budget.ready_at() == pytest.approx(clock.now)
    with pytest.raises(ValueError, match="a message budget of 0 a second: give a positive rate"):
        MessageBudget(0)


def test_the_text_form_prints_a_summary_line_for_a_large_group_and_follows_expanded_ranks():
    g, out = FakeGroup(64), io.StringIO()
    rep = TextReporter(g, out, min_interval_s=0.0, summary_interval_s=3600.0)
    g.set_state(GroupState.RUNNING, **{f"r{r}": "running" for r in range(64)})
    for step in range(3):
        for rank in range(64):
            g.report(rank, {"step": step, "loss": 0.5}, t=time.time(), total=3)
    lines = out.getvalue().splitlines()
    assert len(lines) == 1 and lines[0].startswith("raytrain_nb 64 workers: 64 running · steps 1/3")
    assert rep.expand("8-9") == {8, 9}
    g.report(8, {"step": 2, "loss": 0.4}, t=time.time())
    g.set_state(GroupState.IDLE, **{f"r{r}": "idle" for r in range(64)})
    lines = out.getvalue().splitlines()
    assert lines[1].startswith("raytrain_nb [rank 8]  3/3") and lines[2].startswith("raytrain_nb [rank 9]  3/3")
    assert lines[3].startswith("raytrain_nb [rank 8]  3/3  ") and "loss=0.4" in lines[3]
    assert lines[-1].startswith("raytrain_nb 64 workers: 64 idle · steps 3/3") and len(lines) == 5
