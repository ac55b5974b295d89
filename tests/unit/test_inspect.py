"""Looking inside a group, as logic: slow ranks, grouping stacks, the quiet-cell watch, resources, the pdb bridge."""
from __future__ import annotations

import os
import threading

import psutil

from raytrain_nb._internal.group.cellwatch import QuietWatch
from raytrain_nb._internal.group.vitals import Vitals, resources_text
from raytrain_nb._internal.group.whereabouts import RankWhere, Whereabouts, call_name, describe
from raytrain_nb._internal.worker import where as worker_where
from raytrain_nb._internal.worker.debugger import Bridge
from raytrain_nb._internal.worker.resources import ResourceSampler

from ..waiting import bounded


def reports(rank, times):
    return [{"rank": rank, "time": t} for t in times]


def test_a_rank_is_slow_after_three_slow_steps_whatever_order_its_reports_came_in():
    slow_first = Vitals()
    slow_first.on_reports(reports(1, [0, 0.3, 0.6, 0.9, 1.2]))  # rank 1's batch before its peer's
    assert slow_first.on_reports(reports(0, [0, 0.1, 0.2, 0.3, 0.4]))
    assert slow_first.slow_ranks() == [1]
    fast_first = Vitals()
    fast_first.on_reports(reports(0, [0, 0.1, 0.2, 0.3, 0.4]))
    fast_first.on_reports(reports(1, [0, 0.3, 0.6]))
    assert fast_first.slow_ranks() == []  # two slow steps are not enough
    fast_first.on_reports(reports(1, [0.9]))
    assert fast_first.slow_ranks() == [1] and abs(fast_first.of(1)["step_time"] - 0.3) < 1e-9
    fast_first.on_reports(reports(1, [1.0, 1.1, 1.2]))
    assert fast_first.slow_ranks() == []  # it caught up
    fast_first.new_cell()
    fast_first.on_reports(reports(0, [5.0]))  # the time since the last cell is no step
    assert abs(fast_first.of(0)["step_time"] - 0.1) < 1e-9 and fast_first.changed()


def test_equal_ranks_are_never_slow():
    v = Vitals()
    for r in range(4):
        v.on_reports(reports(r, [0, 0.1, 0.2, 0.3, 0.4, 0.5]))
    assert v.slow_ranks() == []


def test_ranks_with_the_same_stack_are_grouped_odd_one_first():
    frames = lambda line, code: [{"file": "<cell-5>", "line": line, "function": "<module>", "code": code,
                                  "user": True}]
    coll = {"call": "_run_cell", "frames": frames(4, "dist.all_reduce(t)"), "collective": {"name": "all_reduce",
                                                                                           "seconds": 61.4}}
    sleep = {"call": "_run_cell", "frames": frames(7, "time.sleep(100)")}
    where = Whereabouts([describe(0, coll), describe(1, sleep), describe(2, dict(coll, collective={
        "name": "all_reduce", "seconds": 61.2})), describe(3, coll)])
    assert where.line() == ("rank 1: in time.sleep (cell 5, line 7); "
                            "ranks 0, 2, 3: in all_reduce for 61 s (cell 5, line 4)")
    assert "    cell 5, line 7, in <module>: time.sleep(100)" in str(where)
    assert describe(0, {"call": None}).summary == "idle (no cell running)"
    ddp = {"call": "_run_cell", "ddp": True, "frames": frames(3, "loss.backward()") + [
        {"file": "/x/torch/_tensor.py", "line": 1, "function": "backward", "code": "", "user": False}]}
    assert describe(0, ddp).summary == "in loss.backward() (DDP gradient sync) (cell 5, line 3)"
    assert Whereabouts([RankWhere(0, "dead: killed", key=("died",)), RankWhere(1, "dead: killed", key=("died",))
                        ]).line() == "ranks 0, 1: dead: killed"


def test_call_name_is_the_outermost_call_of_the_line():
    assert call_name("time.sleep(10)") == "time.sleep"
    assert call_name("x = model(torch.randn(2, 3)).sum()") == "model(torch.randn(2, 3)).sum"
    assert call_name("for x in") == "for x in"


def test_the_quiet_watch_says_once_after_the_quiet_time():
    now = [0.0]
    said = []
    watch = QuietWatch(60.0, lambda: "rank 1: in time.sleep", said.append, clock=lambda: now[0])
    now[0] = 59.0
    assert not watch.check()
    watch.heard()
    now[0] = 118.0
    assert not watch.check()
    now[0] = 119.5
    assert watch.check() and said == ["raytrain_nb: no output for 60 s; rank 1: in time.sleep"]
    now[0] = 500.0
    assert not watch.check() and len(said) == 1
    assert not QuietWatch(0.0, lambda: "x", said.append, clock=lambda: 1e9).check()  # 0 turns it off


def test_the_sample_matches_this_process_and_is_taken_at_most_once_a_second():
    sampler = ResourceSampler()
    first = sampler.sample()
    own = psutil.Process(os.getpid()).memory_info().rss
    assert abs(first["rss"] - own) < 0.1 * own and first["mem_limit"] > 0 and first["mem_used"] > 0
    assert sampler.sample() is first
    assert "rss " in resources_text(first) and "MEM!" not in resources_text(dict(first, mem_flag=False))
    assert "MEM!" in resources_text(dict(first, mem_flag=True))


def test_a_collective_records_its_name_while_it_runs():
    entered = []
    fake = worker_where._wrap("all_reduce", lambda t: entered.append(worker_where.in_collective()))
    fake(1)
    assert entered[0]["name"] == "all_reduce" and worker_where.in_collective() is None


def test_the_bridge_hands_lines_to_pdb_and_ends_on_request():
    bridge = Bridge()
    bridge.open(acked=True)
    bridge.write("(Pdb) ")
    bridge.send("p x")
    assert bridge.readline() == "p x\n"
    assert bridge.poll()["output"] == "(Pdb) "
    threading.Timer(0.1, bridge.end).start()
    try:
        bounded(5, "the ended session", bridge.readline)
    except BaseException as exc:  # noqa: BLE001 - SessionEnded is a BaseException
        assert type(exc).__name__ == "SessionEnded"
    else:
        raise AssertionError("readline returned after the session ended")
    bridge.open(acked=False)
    bridge.send(None, refuse="no cell")
    try:
        bounded(5, "the refused session", bridge.readline)
    except BaseException as exc:  # noqa: BLE001
        assert type(exc).__name__ == "Refused" and exc.reason == "no cell"
