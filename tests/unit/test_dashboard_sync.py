"""When the dashboard's widgets update: only what changed, at most every 100 ms, nothing for a no-op cell."""
from __future__ import annotations

import time
from collections import Counter

import ipywidgets
import pytest

from raytrain_nb import GroupState
from raytrain_nb.notebook.dashboard.sync import Pending, assign
from raytrain_nb.notebook.dashboard.view import Dashboard

from ..waiting import wait_for
from .fake_group import FakeGroup


class Clock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clocked():
    """A dashboard without its timer thread, on a hand-moved clock: the test calls tick()."""
    clock = Clock()
    d = Dashboard(FakeGroup(), clock=clock, timer=False)
    yield d, clock
    d.close()


@pytest.fixture
def sent(monkeypatch):
    """Every widget message sent to the front end, as (widget, message)."""
    out = []
    original = ipywidgets.Widget._send

    def counting(widget, msg, buffers=None):
        out.append((widget, msg))
        return original(widget, msg, buffers=buffers)

    monkeypatch.setattr(ipywidgets.Widget, "_send", counting)
    return out


def _cell(g, state=GroupState.RUNNING, worker="running"):
    g.set_state(state, **{f"r{w.rank}": worker for w in g.workers})


def test_assign_sends_only_traits_that_differ_and_several_as_one_message(sent):
    html, bar = ipywidgets.HTML(value="a"), ipywidgets.IntProgress(value=1, max=5)
    sent.clear()
    assert assign(html, value="a") == 0 and assign(bar, max=5, value=1) == 0 and sent == []
    assert assign(bar, max=9, value=7, bar_style="info") == 3
    assert len(sent) == 1 and sent[0][1]["state"] == {"max": 9, "value": 7, "bar_style": "info"}


def test_a_no_op_cell_sends_no_widget_message(clocked, sent):
    dash, clock = clocked
    g = dash.group
    dash.tick()  # the empty plot is drawn once
    dash.flush()
    sent.clear()
    for _ in range(3):  # three no-op %%distributed cells: RUNNING -> IDLE within 20 ms
        _cell(g)
        clock.now += 0.02
        assert not dash.tick(), "a cell that ran 20 ms is not shown yet"
        _cell(g, GroupState.IDLE, "idle")
        clock.now += 0.2
        assert dash.tick(), "the flush after the cell is due"
    dash.flush()
    assert sent == [], [(type(w).__name__, m["state"]) for w, m in sent]
    g.set_state(GroupState.FAILED, r1="dead")  # the count is live: a visible change is sent
    clock.now += 0.2
    assert dash.tick() and {"HTML", "Button", "HBox"} <= {type(w).__name__ for w, _ in sent}


def test_a_flush_that_finds_nothing_new_sends_nothing(clocked, sent):
    dash, clock = clocked
    _cell(dash.group)
    clock.now += 0.2
    assert dash.tick() and sent, "a cell running for 200 ms is shown"
    sent.clear()
    dash.flush()
    dash.group.set_state(GroupState.RUNNING)  # a worker-only notice (old is new): nothing visible changed
    clock.now += 0.2
    assert dash.tick() and sent == [], [(type(w).__name__, m["state"]) for w, m in sent]


def test_a_foreground_cell_turns_every_button_off_with_the_reason_within_100_ms(clocked):
    dash, clock = clocked
    g = dash.group
    _cell(g)  # this (the UI) thread: a foreground cell
    clock.now += 0.05
    assert not dash.tick() and not dash.buttons["checkpoint"].disabled  # a cell this short may end unseen
    clock.now += 0.051  # the cell has run 100 ms
    assert dash.tick()
    assert all(b.disabled and "foreground" in b.tooltip for b in dash.buttons.values())
    assert "foreground cell running" in dash.title.value and "rtnb-state-running" in dash.rows[0].box._dom_classes
    _cell(g, GroupState.IDLE, "idle")
    clock.now += 0.101
    assert dash.tick() and not dash.buttons["checkpoint"].disabled and ">idle<" in dash.title.value


def test_a_burst_of_reports_is_at_most_one_flush_per_100_ms(clocked, sent):
    dash, clock = clocked
    g = dash.group
    _cell(g)
    flushed_at, per_flush = [], []
    for i in range(300):  # 150 steps on each of 2 ranks, one report every ms
        clock.now += 0.001
        before = len(sent)
        g.report(i % 2, {"step": i // 2, "loss": 1.0 / (i + 1)}, t=clock.now, total=150)
        if dash.tick():
            flushed_at.append(clock.now)
            per_flush.append(Counter(id(w) for w, _ in sent[before:]))
    gaps = [b - a for a, b in zip(flushed_at, flushed_at[1:])]
    assert 2 <= len(flushed_at) <= 3 and all(gap >= 0.1 - 1e-9 for gap in gaps), flushed_at
    assert all(max(c.values(), default=1) == 1 for c in per_flush), "a widget got two messages in one flush"
    _cell(g, GroupState.IDLE, "idle")
    clock.now += 0.2
    assert dash.tick()
    row = dash.rows[1]
    assert (row.bar.value, row.bar.max, row.done.value) == (150, 150, "150/150") and "loss=" in row.metrics.value


def test_the_timer_thread_coalesces_a_burst_and_shows_its_end():
    dash = Dashboard(FakeGroup())
    try:
        before, started = dash.flushes, time.monotonic()
        for i in range(400):
            dash.group.report(i % 2, {"step": i // 2}, t=time.time(), total=200)
        wait_for(lambda: dash.rows[1].bar.value == 200, 10, "rank 1's bar to show its last report")
        took = time.monotonic() - started
        assert dash.flushes - before <= 2 + took / 0.1, f"{dash.flushes - before} flushes in {took:.2f} s"
    finally:
        dash.close()


def test_pending_holds_a_new_cell_but_not_its_reports_for_long():
    clock = Clock()
    p = Pending(interval_s=0.1, latest_s=1.0, clock=clock)
    assert p.due() is None
    p.mark(workers=True, cell=True)
    assert p.due() == pytest.approx(clock.now + 0.1) and p.holding()
    clock.now += 0.03
    p.mark(workers=True, cell=False)  # it ended: shown at once (the last flush was long ago)
    assert p.due() <= clock.now and not p.holding()
    seq, changes = p.peek()
    p.mark(ranks=[1])  # came while a flush read the group: kept for the next one
    assert not p.clear(seq) and changes.workers and p.due() == pytest.approx(clock.now + 0.1)
    seq, changes = p.peek()
    assert p.clear(seq) and changes.ranks == {1} and p.due() is None
    first = clock.now
    for _ in range(30):  # short cells back to back, every 50 ms, reporting: the reports wait at most 1 s
        p.mark(ranks=[0], cell=True)
        clock.now += 0.05
        p.mark(cell=False)
        p.mark(cell=True)
        assert p.due() <= first + 1.0 + 1e-9
