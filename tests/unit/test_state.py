"""The group's state machine: which transitions exist, and that a forbidden one raises."""
import types

import pytest

from raytrain_nb._internal.errors import GroupError, TransitionError
from raytrain_nb._internal.group.config import GroupConfig
from raytrain_nb._internal.group.core import GroupCore, Settings
from raytrain_nb._internal.group.slots import Slot, SlotTable
from raytrain_nb._internal.group.state import TRANSITIONS, GroupState, SlotState, check_transition

S = GroupState

#: Every transition a group makes, and why (the table in state.py must say exactly this).
EXPECTED = {
    (S.STARTING, S.IDLE): "the workers formed the group",
    (S.STARTING, S.RUNNING): "the start-up storage check runs on the workers",
    (S.STARTING, S.SHUTDOWN): "shut down before it was ready",
    (S.IDLE, S.RUNNING): "a cell or function starts",
    (S.IDLE, S.FAILED): "a worker died between cells",
    (S.IDLE, S.RECOVERING): "restart or rescale",
    (S.IDLE, S.SHUTDOWN): "shutdown",
    (S.RUNNING, S.IDLE): "the cell ended",
    (S.RUNNING, S.FAILED): "a worker died during the cell",
    (S.RUNNING, S.RECOVERING): "a rank that ignored two interrupts is replaced",
    (S.RUNNING, S.SHUTDOWN): "shutdown",
    (S.FAILED, S.RUNNING): "a failed rescale left every worker alive: cells run again",
    (S.FAILED, S.RECOVERING): "restart or rescale",
    (S.FAILED, S.SHUTDOWN): "shutdown",
    (S.RECOVERING, S.IDLE): "recovered",
    (S.RECOVERING, S.FAILED): "recovery failed",
    (S.RECOVERING, S.SHUTDOWN): "shutdown",
}


def test_the_table_lists_exactly_the_transitions_a_group_makes():
    table = {(old, new) for old, news in TRANSITIONS.items() for new in news}
    assert table == set(EXPECTED)
    assert set(TRANSITIONS) == set(GroupState)  # every state has a row
    assert not TRANSITIONS[S.SHUTDOWN]  # the end


@pytest.mark.parametrize("old", list(GroupState))
@pytest.mark.parametrize("new", list(GroupState))
def test_check_transition_follows_the_table(old, new):
    if old is new or (old, new) in EXPECTED:
        check_transition(old, new)
    else:
        with pytest.raises(TransitionError, match=rf"cannot go from '{old.value}' to '{new.value}' \(allowed from"):
            check_transition(old, new)


def test_states_are_the_strings_users_compare_with():
    assert S.IDLE == "idle" and S.SHUTDOWN == "shut down" and SlotState.DEAD == "dead"
    assert f"{S.RUNNING}" == "running" and str(SlotState.UNRESPONSIVE) == "unresponsive"
    assert SlotState.DEAD.gone and SlotState.UNRESPONSIVE.gone and not SlotState.FAILED.gone
    assert issubclass(TransitionError, GroupError)


def _core(state, workers=0):
    """A group core without Ray: its state, observers and slots (the slots' actors are names)."""
    core = GroupCore(GroupConfig(num_workers=max(workers, 1)), Settings("t", 1.0, 1.0, 1.0, 0),
                     run_storage=types.SimpleNamespace())
    core.state = state
    core.slots.assign([Slot(actor=f"a{i}", pg="pg", bundle=i, info={"pid": 10 + i}, joined=True)
                       for i in range(workers)])
    return core


def test_transition_tells_observers_and_refuses_what_the_table_forbids():
    group = _core(S.IDLE)
    seen = []
    group.subscribe(lambda old, new: seen.append((old, new)))
    group.transition(S.RUNNING)
    group.transition(S.RUNNING)  # staying is no change: observers are not told
    group.transition(S.IDLE)
    assert seen == [(S.IDLE, S.RUNNING), (S.RUNNING, S.IDLE)]
    group.transition(S.SHUTDOWN)
    with pytest.raises(TransitionError, match="cannot go from 'shut down' to 'idle'"):
        group.transition(S.IDLE)
    assert group.state is S.SHUTDOWN and seen[-1] == (S.IDLE, S.SHUTDOWN)


def test_a_death_marks_its_rank_and_fails_an_idle_group_once():
    core = _core(S.IDLE, workers=2)
    seen = []
    core.subscribe(lambda old, new: seen.append((old, new)))
    a1 = core.slots[1].actor  # the slot table knows a worker by its handle (identity)
    core.mark_unresponsive(a1, 31.0)
    assert core.slots[1].state is SlotState.UNRESPONSIVE and "31 s" in core.slots[1].error
    assert core.state is S.FAILED and seen == [(S.IDLE, S.FAILED)]
    core.mark_dead(a1, "SIGKILL")  # dead wins over silent; the group already failed: observers told of the rank
    core.mark_unresponsive(a1, 40.0)  # a dead rank stays dead
    core.mark_dead("nobody", "x")  # not one of ours: nothing
    assert core.slots[1].state is SlotState.DEAD and core.slots[1].error == "SIGKILL"
    assert seen == [(S.IDLE, S.FAILED), (S.FAILED, S.FAILED)]
    with pytest.raises(GroupError, match=r"rank\(s\) 1 are dead or not responding: %dist_restart"):
        core.check_usable()


def test_a_worker_left_unjoined_by_a_failed_recovery_is_dropped_and_nothing_runs_on_it():
    """A rescale whose only holder of the state died while a new rank joined: the new rank holds nothing, so it
    goes (dead), and the group shows it; until then no cell or snapshot may run on it."""
    from raytrain_nb._internal.group.undo import drop_unjoined

    core = _core(S.FAILED, workers=2)
    core.slots[0].mark(SlotState.DEAD, "SIGKILL")
    core.slots[1].joined = False
    core.slots[1].mark(SlotState.IDLE)
    with pytest.raises(GroupError, match=r"rank\(s\) 1 never joined the group .* hold none of its state"):
        core.check_usable()
    drop_unjoined(core)
    assert core.slots[1].state is SlotState.DEAD and "held none of the group's state" in core.slots[1].error
    assert core.slots[0].error == "SIGKILL"  # a rank that had joined keeps what it was
    with pytest.raises(GroupError, match=r"rank\(s\) 0, 1 are dead or not responding"):
        core.check_usable()


def test_sharded_models_left_off_the_process_group_refuse_every_cell_in_one_line_until_they_are_mirrored_again():
    core = _core(S.FAILED, workers=2)
    core.mirrors.unsettled = "a rescale failed after re-forming the process group (x): %dist_rescale N re-shards"
    with pytest.raises(GroupError, match=r"^the sharded models are not sharded over the group's process group: "
                                         r"a rescale failed .*%dist_rescale N re-shards$"):
        core.check_usable()
    core.mirrors.unsettled = ""  # what a refresh of the mirrors does (a re-shard that worked, a rollback)
    core.check_usable()


def test_a_running_or_shut_down_group_takes_no_command():
    core = _core(S.RUNNING, workers=1)
    with pytest.raises(GroupError, match="the group is running a cell: wait for it, or interrupt it"):
        core.check_not_running()
    core.background = types.SimpleNamespace(done=lambda: False)
    with pytest.raises(GroupError, match="a background cell is running: %dist_wait waits for it"):
        core.check_not_running()
    core.state = S.SHUTDOWN
    with pytest.raises(GroupError, match="this group was shut down: start a new one"):
        core.check_not_running()


def test_slot_table_tells_live_and_gone_ranks():
    table = SlotTable()
    slots = [Slot(actor=f"a{i}", pg="pg", bundle=i, info={}) for i in range(3)]
    table.assign(slots)
    slots[0].mark(SlotState.IDLE)
    slots[1].mark(SlotState.DEAD, "killed")
    slots[2].mark(SlotState.UNRESPONSIVE, "silent")
    assert table.live_ranks() == [0] and table.gone_ranks() == [1, 2]
    assert table.rank_of(slots[2].actor) == 2 and table.rank_of("nobody") is None
    new = Slot(actor="b", pg="pg", bundle=1, info={})
    assert table.put(1, new) is slots[1] and table[1] is new
    table.spares.append(Slot(actor="spare", pg="pg", bundle=3, info={}))
    assert [s.actor for s in table.everyone()] == ["a0", "b", "a2", "spare"]
    assert table.take_spare().actor == "spare" and table.take_spare() is None
    assert slots[1].error == "killed" and slots[1].place == ("pg", 1)


def test_a_place_that_does_not_come_back_is_named_with_the_deadline(monkeypatch):
    """A restart whose dead rank's node left the cluster: the AwaitPlaces step fails with the fix, not a crash."""
    from raytrain_nb._internal.group import executor
    from raytrain_nb._internal.group.plans import AwaitPlaces, plan_recovery

    core = _core(S.FAILED, workers=2)
    monkeypatch.setattr(executor, "await_bundles", lambda places, timeout_s: False)
    run = executor.Execution(core, None, plan_recovery(core.kind, "restart", live=[0], gone=[1]))
    with pytest.raises(GroupError, match=r"the place of rank\(s\) 1 is gone .* within 1 s: continue with fewer "
                                         r"workers \(%dist_rescale N"):
        run.do_awaitplaces(AwaitPlaces((1,)))
