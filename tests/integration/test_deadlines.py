"""Stopped ranks cost one deadline, not one per rank: pull, status and interrupt ask every rank at once."""
from __future__ import annotations

import os
import signal
import time

import pytest

from raytrain_nb import GroupError, WorkerGroup
from raytrain_nb._internal.group import timing

from ..groups import quiet

#: What a test allows beyond one deadline (a second deadline, as asking rank by rank costs, is more).
SLACK_S = 1.5


@pytest.fixture
def stopped(ray_session, monkeypatch):
    """A 3-rank group whose ranks 1 and 2 are stopped (SIGSTOP) while the test runs; short deadlines."""
    monkeypatch.setattr(timing, "PULL_S", 2.0)
    group = WorkerGroup(3, cpus_per_worker=0.5, heartbeat_timeout_s=120, backend="none")
    pids = []
    try:
        quiet(group, "import raytrain_nb as train\nx = 10 + train.get_context().get_world_rank()")
        pids = [s.pid for s in group.status()[1:]]
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        yield group
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGCONT)
        group.shutdown()


def _timed(fn):
    start = time.monotonic()
    try:
        return fn(), time.monotonic() - start
    except Exception as exc:  # noqa: BLE001 - returned for the test to look at
        return exc, time.monotonic() - start


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_stopped_ranks_cost_one_deadline(stopped):
    error, took = _timed(lambda: stopped.pull("x", rank=None))
    assert isinstance(error, GroupError), error
    assert "rank(s) 1, 2 did not answer within 2 s" in str(error)
    assert took < timing.PULL_S + SLACK_S

    answers, took = _timed(stopped.interrupt)
    assert [a.get("state") for a in answers[1:]] == ["unreachable", "unreachable"], answers
    assert took < timing.INTERRUPT_CALL_S + SLACK_S

    rows, took = _timed(stopped.status)
    assert len(rows) == 3 and took < timing.PING_S + SLACK_S

    for pid in [s.pid for s in rows[1:]]:
        os.kill(pid, signal.SIGCONT)
    assert stopped.pull("x", rank=None) == [10, 11, 12]
