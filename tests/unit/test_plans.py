"""Recovery plans, without Ray: every kind x restart / rescale up / rescale down / all ranks dead / a spare."""
from __future__ import annotations

import pytest

import raytrain_nb  # noqa: F401 - registers the framework backends
from raytrain_nb._internal.errors import GroupError
from raytrain_nb._internal.group import plans
from raytrain_nb._internal.group.kinds import kind_for
from raytrain_nb._internal.group.plans import (AwaitPlaces, Carry, CopyFromPeer, Join, LoadCarried, Rebind, Replay,
                                               Reserve, Retire, Spawn, plan_recovery)

TORCH, NONE, XGB, TF = (kind_for(b) for b in ("gloo", "none", "xgboost", "tensorflow"))


def kinds_of(plan):
    return [type(s).__name__ for s in plan.steps]


@pytest.mark.parametrize("kind", [TORCH, NONE, XGB])
def test_restart_in_place_replaces_only_the_dead_ranks(kind):
    plan = plan_recovery(kind, "restart", live=[0, 2], gone=[1])
    assert plan.in_place and plan.keep == (0, 2) and plan.new_ranks == (1,) and plan.src == 0
    expected = [Retire((1,), True), AwaitPlaces((1,)), Spawn((1,)), Replay((1,)), Join(0, (1,))]
    if kind.copies_through_driver:  # no process group carried the state: the driver copies it
        expected.append(CopyFromPeer(0, (1,)))
    assert list(plan.steps) == expected + [Rebind()]


def test_a_spare_takes_the_place_without_waiting_for_it():
    plan = plan_recovery(TORCH, "restart", live=[0], gone=[1], spares=1)
    assert list(plan.steps[:3]) == [Retire((1,), False), Spawn((1,), spares=1), Replay((1,))]
    plan = plan_recovery(TORCH, "restart", live=[0], gone=[1, 2], spares=1)
    assert list(plan.steps[:3]) == [Retire((1, 2), True), AwaitPlaces((2,)), Spawn((1, 2), spares=1)]


@pytest.mark.parametrize("kind", [TORCH, NONE, XGB, TF])
def test_restart_with_every_rank_dead_needs_a_checkpoint(kind):
    with pytest.raises(GroupError, match=r"no live worker is left to copy the state from: restart from a checkpoint"):
        plan_recovery(kind, "restart", live=[], gone=[0, 1])
    plan = plan_recovery(kind, "restart", live=[], gone=[0, 1], from_checkpoint=True)
    assert plan.src is None and Join(None, plan.new_ranks) in plan.steps
    assert not any(isinstance(s, (CopyFromPeer, Carry, LoadCarried)) for s in plan.steps)


def test_nothing_to_restart_is_said():
    with pytest.raises(GroupError, match=r"no dead worker to restart: every rank is alive"):
        plan_recovery(TORCH, "restart", live=[0, 1], gone=[])


@pytest.mark.parametrize("kind", [TORCH, NONE, XGB])
def test_rescale_up_keeps_every_live_rank_and_adds_new_ones(kind):
    plan = plan_recovery(kind, "rescale", live=[0, 1], gone=[], num_workers=4)
    assert not plan.in_place and plan.keep == (0, 1) and plan.new_ranks == (2, 3) and plan.drop == ()
    assert kinds_of(plan)[:4] == ["Reserve", "Retire", "Spawn", "Replay"] and plan.steps[0] == Reserve(2)
    assert Join(0, (2, 3)) in plan.steps and (CopyFromPeer(0, (2, 3)) in plan.steps) == kind.copies_through_driver
    assert plan_recovery(kind, "rescale", live=[0, 1], gone=[], num_workers=4, free_places=2).steps[0] == \
        Retire((), True)  # places kept from an earlier shrink: nothing to reserve


@pytest.mark.parametrize("kind", [TORCH, NONE, XGB])
def test_rescale_down_drops_the_highest_ranks_and_the_dead(kind):
    plan = plan_recovery(kind, "rescale", live=[0, 2, 3], gone=[1], num_workers=2)
    assert plan.keep == (0, 2) and plan.drop == (3, 1) and plan.new_ranks == ()
    assert list(plan.steps) == [Retire((3, 1), False), Join(0, ()), Rebind()]


def test_fresh_processes_replace_every_rank_and_carry_the_state():
    for operation, size in (("restart", None), ("rescale", 3)):
        plan = plan_recovery(TF, operation, live=[0], gone=[1], num_workers=size)
        assert plan.keep == () and plan.src is None and plan.new_ranks == tuple(range(size or 2))
        assert plan.steps[0] == Carry(0) and plan.steps[-2:] == (LoadCarried(), Rebind())
    plan = plan_recovery(TF, "restart", live=[], gone=[0, 1], carried=True)  # a renewal that failed kept it
    assert plan.steps[0] == Retire((0, 1), True) and LoadCarried() in plan.steps


@pytest.mark.parametrize("size", [0, -1, 1.5, True, "2"])
def test_a_bad_size_is_refused(size):
    with pytest.raises(GroupError, match=rf"rescale to {size!r} workers is not possible: give a whole number"):
        plan_recovery(TORCH, "rescale", live=[0], gone=[], num_workers=size)


def test_every_rank_dead_cannot_rescale():
    with pytest.raises(GroupError, match=r"every worker is dead: nothing to keep"):
        plan_recovery(NONE, "rescale", live=[], gone=[0, 1], num_workers=1)


def test_a_plan_describes_itself():
    text = plan_recovery(TORCH, "restart", live=[0], gone=[1]).describe()
    assert text.splitlines()[0] == "Retire(ranks=(1,), await_deaths=True)" and "Join(src=0, ranks=(1,))" in text
    assert plans.NO_SOURCE.startswith("no live worker")


def test_a_recovery_says_where_its_seconds_went():
    from raytrain_nb._internal.group.executor import RecoveryTimings

    t = RecoveryTimings("restart", (("Retire", 0.01), ("Spawn", 0.4), ("Replay", 1.5), ("Join", 0.3),
                                    ("Rebind", 0.02)), import_s=1.1)
    assert t.seconds("Replay") == 1.5 and t.seconds("Carry") == 0 and abs(t.total_s - 2.23) < 1e-9
    assert str(t) == ("restart 2.23 s: Retire 0.01 s, Spawn 0.40 s, Replay 1.50 s (importing 1.10 s), Join 0.30 s, "
                      "Rebind 0.02 s")


def test_a_sharded_group_gathers_the_mirrors_first_and_reshards_after_joining():
    from raytrain_nb._internal.group.plans import GatherMirrors, Reshard

    plan = plan_recovery(TORCH, "restart", live=[0], gone=[1], sharded=True)
    assert list(plan.steps) == [GatherMirrors(), Retire((1,), True), AwaitPlaces((1,)), Spawn((1,)), Replay((1,)),
                                Join(0, (1,)), Reshard(from_mirrors=True), Rebind()]
    plan = plan_recovery(TORCH, "rescale", live=[0, 1, 2], gone=[], num_workers=2, sharded=True)
    assert kinds_of(plan) == ["GatherMirrors", "Retire", "Join", "Reshard", "Rebind"]
    plan = plan_recovery(TORCH, "restart", live=[0], gone=[1], sharded=True, from_checkpoint=True,
                         unmirrored=[1], unmirrored_why="off")
    assert kinds_of(plan)[0] == "Retire" and Reshard(from_mirrors=False) in plan.steps


def test_a_sharded_rank_whose_mirror_is_gone_too_is_refused_in_one_line():
    with pytest.raises(GroupError, match=r"^the shards of rank\(s\) 1 are gone: their buddy.*; restart from a "
                                         r"snapshot \(%dist_restart --from-checkpoint NAME"):
        plan_recovery(TORCH, "restart", live=[0], gone=[1, 2], sharded=True, unmirrored=[1],
                      unmirrored_why="their buddy, which kept their mirror, is gone too")
