"""Mirrors of the shards every K reports: a rank SIGKILLed in the middle of a long cell comes back, on restart, as
it was at the last report every rank's buddy had mirrored, not as it was when the cell began."""
from __future__ import annotations

import os
import signal
import time

import pytest
import torch

from raytrain_nb import WorkerGroup

from ..groups import quiet
from .test_sharded_group import BUILD, TRAIN_FN, assert_same, full_state

#: Ten reports, each after one step, with a pause; rank 0 saves the gathered full state at each report first, and
#: every rank marks each report it made.
CELL = """
import time
_rank = train.get_context().get_world_rank()
for _i in range(1, 11):
    train_steps(1)
    _full = full()
    if _rank == 0:
        torch.save(_full, os.path.join({out!r}, f"full_{{_i}}.pt"))
    train.report({{"i": _i}})
    open(os.path.join({out!r}, f"reported_{{_rank}}_{{_i}}"), "w").close()
    time.sleep(1.0)
"""


def _wait_for(condition, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"waited {timeout_s} s for {what}"
        time.sleep(0.05)


@pytest.fixture
def group(ray_session, tmp_path_factory):
    group = WorkerGroup(2, storage_path=str(tmp_path_factory.mktemp("runs")), name="mirror-every")
    quiet(group, "import os\n" + BUILD + TRAIN_FN, setup=True)  # replayed by a new rank
    quiet(group, "train_steps(2)")
    yield group
    group.shutdown()


def test_a_rank_killed_mid_cell_comes_back_at_the_last_mirrored_report(group, tmp_path):
    assert "every 2 reports" in group.mirror_shards(True, every=2)
    mirrors = group._core.mirrors
    run = group.run(CELL.format(out=str(tmp_path)), output="none", background=True)
    _wait_for(lambda: all((tmp_path / f"reported_{r}_6").exists() for r in (0, 1)), 120, "6 reports on each rank")
    _wait_for(lambda: mirrors.point_report >= 6, 30, "the mirror point of report 6 kept by every buddy")
    os.kill(group.status()[1].pid, signal.SIGKILL)
    with pytest.raises(Exception):
        run.wait(120)
    group.restart()
    report = mirrors.restored_report
    assert report >= 6 and report % 2 == 0, report  # a mirror point, and not the cell's start
    assert_same(torch.load(tmp_path / f"full_{report}.pt"), full_state(group))
