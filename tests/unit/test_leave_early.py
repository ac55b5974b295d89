"""A recovery's kept ranks leave their old process group early (``Worker.leave_group``), while the new ranks start:
a leave that reaches a rank after its recovery's join, or after any later join, leaves the group formed there alone."""
from __future__ import annotations

import pytest

from raytrain_nb._internal.backend import ProcessGroupState
from raytrain_nb._internal.worker.actor import Worker

pytest.importorskip("torch.distributed")

ADDR = "127.0.0.1"


@pytest.fixture
def worker():
    """A worker with a process group of its own, whose join forms a gloo group of 1 here and does nothing else (no
    rank context, session or environment of this process is touched)."""
    w = Worker(capture=False)
    w.pg = ProcessGroupState()
    w.pg.backend = "gloo"
    w._join = lambda context, env, addr, port, *rest: {"rebound": w.pg.join("gloo", addr, port, 0, 1),
                                                        "phases": dict(w.pg.join_phases)}
    yield w
    w._cells.call(w.pg.destroy)


def _join(worker, epoch):
    return worker.join({}, {}, ADDR, worker.open_store(ADDR, 1), epoch=epoch)


def test_a_leave_before_its_join_ends_the_old_group_and_one_after_it_keeps_the_new(worker):
    _join(worker, 1)
    assert worker.pg.active and worker.pg.generation == 1
    assert worker.leave_group(5) is True  # the recovery numbered 5 begins: the old group goes
    assert not worker.pg.active
    assert "leave" in _join(worker, 5)["phases"] and worker.pg.generation == 2  # its join forms the new one
    assert worker.leave_group(5) is False  # a leave that came late (after its own join): the new group stays
    assert worker.leave_group(3) is False  # one of an earlier recovery: the same
    assert worker.pg.active and worker.pg.generation == 2
    _join(worker, 7)  # a later re-forming (after an interrupt, numbered by the driver as every join is)
    assert worker.leave_group(6) is False  # a leave held up since an earlier recovery: the group stays
    assert worker.pg.active and worker.pg.generation == 3
    assert worker.leave_group(9) is True  # a later recovery's leave does its work
    assert not worker.pg.active


def test_a_leave_without_a_group_leaves_nothing(worker):
    worker.pg.deferred = True  # a new rank: its group is formed later, on joining
    assert worker.leave_group(4) is False
