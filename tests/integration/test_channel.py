"""Cells over the ranks' loopback channels (group/channels.py) in a real group: used where every rank is on the
driver's machine, the same results as Ray calls, a broken line that costs no cell, a death typed as Ray types it."""
from __future__ import annotations

import os
import signal
import socket
import threading

import pytest

from raytrain_nb import GroupError, WorkerDiedError, WorkerError, WorkerGroup
from raytrain_nb._internal.group.channels import Channel
from raytrain_nb._internal.output import CollectSink

from ..groups import SETUP, quiet, set_up_group
from ..waiting import bounded, wait_for

pytestmark = pytest.mark.ray


def _lines(g: WorkerGroup):
    return [s.channel for s in g._core.slots]


def test_cells_to_ranks_on_this_machine_go_over_their_channels(group):
    quiet(group, "x = 40")
    assert all(isinstance(c, Channel) for c in _lines(group))
    sent = [c.seq for c in _lines(group)]
    quiet(group, "import raytrain_nb as train\ny = x + 2 + train.get_context().get_world_rank()")
    assert [c.seq for c in _lines(group)] == [s + 1 for s in sent], "the cell should have gone over the channels"
    assert group.pull("y", rank=None) == [42, 43]


def test_with_the_channel_off_cells_go_as_ray_calls_with_the_same_results(ray_session, monkeypatch):
    monkeypatch.setenv("RAYTRAIN_NB_CELL_CHANNEL", "0")
    with set_up_group(SETUP) as g:
        quiet(g, "y = rank * 10 + 1")
        assert g.pull("y", rank=None) == [1, 11]
        with pytest.raises(WorkerError, match="ValueError: off"):
            quiet(g, "raise ValueError('off')")
        assert _lines(g) == [None, None], "no channel should be opened"


def _started(sink: CollectSink, rank: int) -> bool:
    """Whether ``rank``'s cell printed ``started`` (it runs user code now)."""
    return any(r == rank and "started" in text for r, _, text in sink.streams)


def test_a_line_that_breaks_while_the_cell_runs_costs_no_cell(group):
    quiet(group, "import time; marker = 0")
    line = _lines(group)[1]
    result = {}
    sink = CollectSink()

    def run():
        group.run("print('started', flush=True); time.sleep(1.0); marker = 7", output="all", sink=sink)
        result["values"] = group.pull("marker", rank=None)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    wait_for(lambda: _started(sink, 1), 30, "rank 1 to run the cell")
    line.sock.shutdown(socket.SHUT_RDWR)  # the driver's end of rank 1's line goes; the rank lives on
    bounded(60, "the cell to end though its line broke", runner.join)
    assert result["values"] == [7, 7]
    quiet(group, "marker += 1")
    assert group.pull("marker", rank=None) == [8, 8]
    assert isinstance(_lines(group)[1], Channel) and _lines(group)[1] is not line, "a new line should be open"


def test_a_rank_killed_mid_cell_over_its_channel_is_typed_as_died(ray_session):
    with set_up_group(SETUP) as g:
        quiet(g, "import time")
        assert all(isinstance(c, Channel) for c in _lines(g))
        pid = g.status()[1].pid
        failure = {}
        sink = CollectSink()

        def run():
            try:
                g.run("print('started', flush=True)\nfor _ in range(600): time.sleep(0.1)", output="all", sink=sink)
            except WorkerError as exc:
                failure["error"] = exc

        runner = threading.Thread(target=run, daemon=True)
        runner.start()
        wait_for(lambda: _started(sink, 0) and _started(sink, 1), 30, "both ranks to run the cell")
        os.kill(pid, signal.SIGKILL)
        g.interrupt()  # rank 0 sleeps on; the cell ends once it stops
        bounded(30, "the cell to end after rank 1 died and rank 0 was interrupted", runner.join)
        errors = [f.exception() for f in failure["error"].failures]
        assert any(isinstance(e, WorkerDiedError) and e.rank == 1 for e in errors), failure["error"]
        assert g.status()[1].state == "dead"


def _weight_sums(g: WorkerGroup):
    """Every rank's model weights, summed."""
    quiet(g, "w_sum = float(model.module.weight.sum())")
    return g.pull("w_sum", rank=None)


def test_rollback_and_load_go_over_the_channels_with_the_ray_path_s_results(group):
    quiet(group, "with torch.no_grad(): model.module.weight.fill_(1.0)\nstep = 5")
    entry = group.checkpoint(name="over-the-line")
    quiet(group, "with torch.no_grad(): model.module.weight.fill_(-3.0)\nstep = 9")
    sent = [c.seq for c in _lines(group)]
    result = group.rollback("over-the-line")
    assert [c.seq for c in _lines(group)] == [s + 1 for s in sent], "the rollback should have gone over the channels"
    assert set(result.restored) >= {"model", "opt"} and "step" in result.changed
    assert _weight_sums(group) == [10, 10]
    quiet(group, "with torch.no_grad(): model.module.weight.fill_(2.0)")
    sent = [c.seq for c in _lines(group)]
    loaded = group.load(entry.path)
    assert [c.seq for c in _lines(group)] == [s + 1 for s in sent], "the load should have gone over the channels"
    assert set(loaded.restored) == set(result.restored) and loaded.verb == "loaded"
    assert _weight_sums(group) == [10, 10]


def test_a_rollback_whose_line_broke_before_it_reached_the_rank_still_rolls_every_rank_back(group):
    quiet(group, "with torch.no_grad(): model.module.weight.fill_(0.5)")
    group.checkpoint(name="before-the-break")
    quiet(group, "with torch.no_grad(): model.module.weight.fill_(7.0)")
    line = _lines(group)[1]
    line.sock.shutdown(socket.SHUT_RDWR)  # the driver's end of rank 1's line goes; the rank lives on
    group.rollback("before-the-break")
    assert _lines(group)[1] is None, "the lost call should have closed the line (and asked the rank through Ray)"
    assert [x * 2 for x in _weight_sums(group)] == [10, 10]
    quiet(group, "pass")
    assert isinstance(_lines(group)[1], Channel) and _lines(group)[1] is not line, "a new line should be open"


def test_a_rollback_that_fails_on_a_rank_raises_the_ray_path_s_error(group, monkeypatch):
    group.checkpoint(name="then-gone")
    quiet(group, "extra = opt\ndel opt")
    errors = []
    for channel in ("1", "0"):
        monkeypatch.setenv("RAYTRAIN_NB_CELL_CHANNEL", channel)
        with pytest.raises(GroupError, match=r"opt \(optimizer\) no longer exist") as info:
            group.rollback("then-gone")
        errors.append(str(info.value))
    assert errors[0] == errors[1], "the channel and Ray paths should fail alike"
    monkeypatch.setenv("RAYTRAIN_NB_CELL_CHANNEL", "1")
    quiet(group, "opt = extra\ndel extra")


def test_a_rank_dead_before_a_rollback_reached_it_is_named(ray_session):
    with set_up_group(SETUP) as g:
        quiet(g, "pass")
        g.checkpoint(name="before-death")
        assert all(isinstance(c, Channel) for c in _lines(g))
        pid = g.status()[1].pid
        os.kill(pid, signal.SIGKILL)
        # the monitor may have seen the death first (the group refuses) or not (the line or Ray says it)
        with pytest.raises((WorkerDiedError, GroupError), match=r"rank(\(s\))? 1\b"):
            g.rollback("before-death")
        wait_for(lambda: g.status()[1].state == "dead", 30, "rank 1 to be marked dead")


def test_pulls_go_over_the_channels_and_fail_as_ray_calls_do(group, monkeypatch):
    quiet(group, "big = torch.arange(3_000_000, dtype=torch.float64) + rank")  # 24 MB: more than one read
    sent = [c.seq for c in _lines(group)]
    pulled = group.pull("big", rank=None)
    assert [c.seq for c in _lines(group)] == [s + 1 for s in sent], "the pull should have gone over the channels"
    assert [float(t[0]) for t in pulled] == [0.0, 1.0] and all(t.numel() == 3_000_000 for t in pulled)
    assert group.pull("rank", rank=1) == 1 and _lines(group)[1].seq == sent[1] + 2
    errors = []
    for channel in ("1", "0"):
        monkeypatch.setenv("RAYTRAIN_NB_CELL_CHANNEL", channel)
        with pytest.raises(GroupError, match=r"name 'nowhere' is not defined on rank 0, 1") as info:
            group.pull("nowhere", rank=None)
        errors.append(str(info.value))
    assert errors[0] == errors[1]
    monkeypatch.setenv("RAYTRAIN_NB_CELL_CHANNEL", "1")
    quiet(group, "del big")
