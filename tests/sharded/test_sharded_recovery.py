"""No shard lost with a rank (``make sharded-test``, outside ``make test``): buddy mirrors of a sharded (FSDP2) group, restart after a kill, rescale 3 and 2, and
the one-line refusal when a rank's mirror went with it. Full parameters and AdamW moments are gathered on the
workers (``full_tensor()``) and compared with those at the last mirror point; training goes on after each."""
from __future__ import annotations

import os
import signal

import pytest
from raytrain_nb import WorkerGroup
from raytrain_nb._internal.errors import GroupError

from ..groups import quiet
from ..waiting import wait_for
from ..integration.test_sharded import BUILD, TRAIN_FN, assert_same, full_state


@pytest.fixture(scope="module")
def group(ray_session, tmp_path_factory):
    group = WorkerGroup(2, storage_path=str(tmp_path_factory.mktemp("runs")), name="sharded-recovery")
    quiet(group, BUILD)  # a cell of its own: new ranks replay it
    quiet(group, TRAIN_FN)
    quiet(group, "train_steps(2)")  # trained: mirrored to the buddies at its end
    yield group
    group.shutdown()


def kill(group, rank):
    pid = group.status()[rank].pid
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: group.status()[rank].state == "dead", 30, f"rank {rank} to be seen dead")


def test_kill_restart_rescale_3_and_2_keep_every_shard(group):
    mirrored = full_state(group)
    group.checkpoint(name="at-2")  # written by 2 ranks: loaded by 3 below (DCP reshards)
    at_2 = mirrored
    kill(group, 1)
    group.restart()
    assert_same(mirrored, full_state(group))
    quiet(group, "train_steps(1)")  # training goes on; mirrored again
    mirrored = full_state(group)
    group.rescale(3)
    assert_same(mirrored, full_state(group))
    quiet(group, "train_steps(1)")
    group.rollback("at-2")  # a snapshot of 2 ranks into 3
    assert_same(at_2, full_state(group))
    quiet(group, "train_steps(1)")
    mirrored = full_state(group)
    group.rescale(2)
    assert_same(mirrored, full_state(group))
    quiet(group, "train_steps(1)")


def test_a_rank_whose_mirror_went_with_it_is_refused_in_one_line(group):
    group.mirror_shards(False)
    kill(group, 1)
    with pytest.raises(GroupError, match=r"the shards of rank\(s\) 1 are gone: mirrors of shards are off.*"
                                         r"--from-checkpoint"):
        group.restart()
