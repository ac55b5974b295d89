"""A sharded group's rescale that meets a death: a buddy that cannot hand a mirror over is replaced by the rank's own
copy before anything is touched, and a rank dying once the group re-formed leaves the live kept workers going, their
models sharded again from the gathered mirrors (never on the old process group's mesh)."""
from __future__ import annotations

import os
import signal

import pytest
import ray
import torch

from raytrain_nb import WorkerGroup
from raytrain_nb._internal.errors import GroupError
from raytrain_nb._internal.group.executor import Execution

from ..groups import each_rank, quiet
from .test_sharded_group import BUILD, TRAIN_FN, assert_same, full_state


@pytest.fixture
def group(ray_session, tmp_path_factory):
    group = WorkerGroup(3, storage_path=str(tmp_path_factory.mktemp("runs")), name="sharded-failed")
    quiet(group, BUILD + TRAIN_FN, setup=True)
    quiet(group, "train_steps(2)")
    yield group
    group.shutdown()


def test_a_buddy_that_no_longer_holds_a_mirror_is_replaced_by_the_ranks_own_copy(group):
    before = full_state(group)
    core = group._core
    ray.get(core.slots[2].actor.mirror_forget.remote(), timeout=60)  # rank 2 kept rank 1's mirror
    group.rescale(2)
    assert each_rank(group, "train.get_context().get_world_size()") == [2, 2]
    assert_same(full_state(group), before)
    quiet(group, "train_steps(1)")  # and it trains on the new mesh


def test_a_kept_rank_dying_once_the_group_re_formed_leaves_the_others_going_at_the_mirror_point(group, monkeypatch):
    before = full_state(group)
    pid = group.status()[1].pid
    reshard = Execution.do_reshard

    def die_first(self, step):  # the fault: rank 1 is SIGKILLed after the group re-formed, before re-sharding
        os.kill(pid, signal.SIGKILL)
        return reshard(self, step)

    monkeypatch.setattr(Execution, "do_reshard", die_first)
    with pytest.raises(GroupError, match="rank 1"):
        group.rescale(2)
    monkeypatch.undo()
    statuses = group.status()
    assert [s.state.value for s in statuses] == ["idle"]
    assert each_rank(group, "train.get_context().get_world_size()") == [1]
    assert_same(full_state(group), before)  # every old rank's shards, from the mirrors, on the 1-rank mesh
    quiet(group, "train_steps(1)")
    group.rescale(3)  # and grows again from its new mirrors
    assert each_rank(group, "train.get_context().get_world_size()") == [3, 3, 3]


def test_a_rescale_that_renumbers_the_kept_ranks_shards_them_at_their_new_ranks(group):
    """Rank 0 dead, rescale to the same size: ranks 1 and 2 become 0 and 1 and a new rank 2 joins. A kept rank's new
    mesh equals its old one (same shape and ranks), so it must not keep the old rank's coordinate."""
    before = full_state(group)
    os.kill(group.status()[0].pid, signal.SIGKILL)
    group.rescale(3)
    assert each_rank(group, "next(iter(model.parameters())).device_mesh.get_coordinate()[0]") == [0, 1, 2]
    assert_same(full_state(group), before)


def test_a_model_that_never_trained_comes_back_though_a_rank_and_its_buddy_are_both_needed(ray_session, tmp_path):
    """Mirroring an optimizer that never stepped makes its state (DCP's zero-lr step): the rank is still clean, so
    when its buddy dies its own fresh copy stands in."""
    group = WorkerGroup(2, storage_path=str(tmp_path), name="never-trained")
    try:
        quiet(group, BUILD, setup=True)  # then no other cell (one would mirror again)
        before = group.pull("model", rank=0)  # gathered by the workers, not a cell
        os.kill(group.status()[1].pid, signal.SIGKILL)  # rank 1 kept rank 0's mirror
        group.restart()
        after = group.pull("model", rank=0)
        assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)
    finally:
        group.shutdown()
