"""A node's ranks polled through one of them (group/nodepoll.py, worker/node_poll.py) on real workers: every
rank's output arrives whole and in order, its reports all reach the driver, and a rank killed mid-cell is still
named as died."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from raytrain_nb import WorkerError, WorkerGroup
from raytrain_nb._internal.group import nodepoll
from raytrain_nb._internal.output import CollectSink

pytestmark = pytest.mark.ray

CELL = """
import time, raytrain_nb as train
r = train.get_context().get_world_rank()
for i in range({n}):
    print(f"{{r}}:{{i}}", flush=True)
    train.report({{"step": i, "rank": r}})
    time.sleep({pause})
"""


class Polled(CollectSink):
    """Collects output; ``seen`` is set once rank 2 printed."""

    def __init__(self) -> None:
        super().__init__()
        self.seen = threading.Event()

    def stream(self, rank, name, text, label):
        super().stream(rank, name, text, label)
        if rank == 2:
            self.seen.set()


@pytest.fixture(scope="module")
def group(ray_session):
    g = WorkerGroup(4, cpus_per_worker=0.25, backend="none", heartbeat_timeout_s=120)
    try:
        yield g
    finally:
        g.shutdown()


def test_every_ranks_output_and_reports_arrive_in_order_through_the_nodes_leader(group, monkeypatch):
    calls = []
    ask = nodepoll.FANOUT.ask

    def counting(slots, call, deadline_s, what, ranks=None):
        calls.append((what, list(ranks or [])))
        return ask(slots, call, deadline_s, what, ranks=ranks)

    monkeypatch.setattr(nodepoll.FANOUT, "ask", counting)
    sink = Polled()
    group.run(CELL.format(n=30, pause=0.01), sink=sink, output="all")
    for rank in range(4):
        lines = "".join(t for r, _, t in sink.streams if r == rank).split()
        assert lines == [f"{rank}:{i}" for i in range(30)], f"rank {rank}'s output"
    history = group.metrics_history
    for rank in range(4):
        steps = [m["metrics"]["step"] for m in history[rank]][-30:]
        assert steps == list(range(30)), f"rank {rank}'s reports"
    node_calls = [c for c in calls if "one call per node" in c[0]]
    assert node_calls and all(ranks == [0] for _, ranks in node_calls), "one node: one poll call, to rank 0"


def test_a_rank_killed_while_its_node_is_polled_through_a_peer_is_named_as_died(group):
    sink = Polled()
    pid = group.slots[2].info["pid"]

    def kill():
        if sink.seen.wait(60):
            os.kill(pid, signal.SIGKILL)

    threading.Thread(target=kill, daemon=True).start()
    with pytest.raises(WorkerError, match=r"rank 2"):
        group.run(CELL.format(n=300, pause=0.01), sink=sink, output="all")
    assert [s.state for s in group.status(ping=False)][2] == "dead"
