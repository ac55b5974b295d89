"""Looking inside a running group on real Ray workers: where every rank is, what it uses, who is slow, a debugger."""
from __future__ import annotations

import psutil
import pytest

from raytrain_nb import WorkerError
from raytrain_nb._internal.output import CollectSink

from ..groups import quiet
from ..waiting import bounded, wait_for

#: rank 1 sleeps while rank 0 waits for it in all_reduce.
SLEEP_VS_ALL_REDUCE = """
import time, torch.distributed as dist
if rank == 1:
    time.sleep({sleep})
t = torch.ones(1)
dist.all_reduce(t)
"""


def test_where_names_the_sleeping_rank_and_the_one_in_all_reduce(group):
    bg = group.run(SLEEP_VS_ALL_REDUCE.format(sleep=4), sink=CollectSink(), background=True)
    line = wait_for(lambda: (lambda text: "all_reduce" in text and "time.sleep" in text and text)(group.where().line()),
                    15, "rank 0 in all_reduce and rank 1 in time.sleep")
    where = group.where()
    assert where.seconds < 1.0, where.seconds
    assert "rank 1: in time.sleep (cell " in line and ", line 4)" in line, line
    assert "rank 0: in all_reduce for " in line, line
    assert "SLEEP_VS" not in str(where) and "time.sleep(4)" in str(where)  # the stack shows the cell's line
    bounded(30, "the background cell to end", bg.wait)
    assert group.where().line() == "ranks 0, 1: idle (no cell running)"


def test_where_on_a_rank_that_skipped_a_collective(group):
    cell = "import torch.distributed as dist\nif rank == 0:\n    dist.barrier()\n"
    bg = group.run(cell, sink=CollectSink(), background=True)
    try:  # rank 1 ends its cell a moment after rank 0 enters the barrier (later on a loaded machine)
        line = wait_for(lambda: (lambda text: "barrier" in text and "rank 1: idle" in text and text)(
            group.where().line()), 15, "rank 0 in barrier and rank 1 done with the cell")
        assert line.startswith("rank 0: in barrier for ") and "rank 1: idle (no cell running)" in line, line
    finally:  # the next tests need the group idle
        group.interrupt()
        with pytest.raises(WorkerError):
            bounded(60, "the interrupted cell to end", bg.wait)
        wait_for(lambda: group.state.value == "idle", 30, "the group to re-form")


def test_a_quiet_cell_says_where_every_rank_is(group):
    sink = CollectSink()
    group.run(SLEEP_VS_ALL_REDUCE.format(sleep=3), sink=sink, quiet_after_s=1.0)
    told = [n for n in sink.notices if "no output for" in n]
    assert len(told) == 1, sink.notices
    assert "rank 1: in time.sleep" in told[0] and "rank 0: in all_reduce for 1 s" in told[0], told[0]


def test_resources_per_rank_match_each_process(group):
    rows = group.status()
    for row in rows:
        own = psutil.Process(row.pid).memory_info().rss
        assert abs(row.resources["rss"] - own) < 0.2 * own, (row.resources, own)
        assert 0 <= row.resources["cpu"] and row.resources["mem_limit"] > 0
    assert "rss " in __import__("raytrain_nb._internal.group.tables", fromlist=["x"]).format_status(rows)


def test_a_rank_slower_than_its_peers_is_marked_slow(group):
    quiet(group, "import time\nfor step in range(7):\n    time.sleep(0.12 if rank == 1 else 0.02)\n"
                 "    train.report({'step': step})\n")
    rows = group.status(ping=False)
    assert rows[1].slow and not rows[0].slow, rows
    assert rows[1].step_time > 1.5 * rows[0].step_time


def test_post_mortem_on_the_failed_rank_through_a_prompt(group):
    with pytest.raises(WorkerError):
        quiet(group, "z = rank * 10\nif rank == 1:\n    1 / 0\n")
    answers = iter(["p z", "q"])
    asked = []
    sink = CollectSink()
    outcome = bounded(30, "the post-mortem", lambda: group.debug(
        rank=1, prompt=lambda text: asked.append(text) or next(answers), sink=sink))
    assert outcome == "quit" and asked == ["[rank 1] (Pdb) ", "[rank 1] (Pdb) "]
    assert "ZeroDivisionError" in sink.text() and "10\n" in sink.text(), sink.text()
    quiet(group, "pass")  # the next cell frees the failure's frames
    with pytest.raises(Exception, match="no failure to debug"):
        group.debug(rank=1, prompt=lambda text: "q", sink=CollectSink())


def test_breakpoint_in_a_cell_pauses_one_rank_and_takes_commands(group):
    answers = iter(["p rank * 7", "c"])
    sink = CollectSink()
    group.run("y = 1\nif rank == 1:\n    breakpoint()\ny = 2\n", sink=sink, prompt=lambda text: next(answers))
    assert "7\n" in sink.text(), sink.text()
    assert group.pull("y", rank=None) == [2, 2]
    refused = CollectSink()
    group.run("if rank == 1:\n    breakpoint()\nw = 3\n", sink=refused)  # no prompt: refused in one line
    assert any("breakpoint() on rank 1 skipped" in n for n in refused.notices), refused.notices
    assert group.pull("w", rank=None) == [3, 3]
