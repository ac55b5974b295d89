"""Real worker deaths: detection, restart from a live peer, rescale, automatic recovery, spares.

The tests of the `group` fixture share one group, reset between them (its ranks start once, not per test);
the others make groups of their own."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from raytrain_nb import GroupError, WorkerError, WorkerGroup
from raytrain_nb._internal.output import CollectSink

from ..groups import MarkerSink as MarkSink
from ..groups import assert_ranks_identical, quiet, same_state
from ..waiting import wait_for

SETUP = """
import torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model, prepare_data_loader
torch.manual_seed(0)
rank = train.get_context().get_world_rank()
model = prepare_model(torch.nn.Linear(10, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
data = torch.utils.data.TensorDataset(torch.randn(48, 10), torch.randn(48, 1))
loader = prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=4))
step = 0
"""
EPOCH = """
for x, y in loader:
    loss = (model(x) - y).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    step += 1
train.report({"step": step, "loss": loss.item()})
"""
LOOP_FOREVER = "print('training', flush=True)\nwhile True:\n" + "\n".join("    " + l for l in EPOCH.strip().splitlines())


def rank_state(group):
    group.run("_s = ([p.detach().clone() for p in model.parameters()], "
          "[v['momentum_buffer'].clone() for v in opt.state.values()], step)", sink=CollectSink())
    return group.pull("_s", rank=None)


def kill_when(sink, pid, sig=signal.SIGKILL):
    def fire():
        if sink.seen.wait(60):  # never later: the pid may by then be a rank of the module's group in another test
            os.kill(pid, sig)
            fire.at = time.monotonic()

    fire.at = None
    threading.Thread(target=fire, daemon=True).start()
    return fire


#: Empties a rank's namespace of a test's variables (what the worker put there itself stays).
CLEAR = "for _k in [k for k in globals() if k not in ('__name__', '__builtins__', 'display')]:\n    del globals()[_k]"


def _reset(group: WorkerGroup) -> bool:
    """Two live ranks again, with an empty namespace and no cell history; False where that is not possible."""
    try:
        if any(r.state in ("dead", "unresponsive") for r in group.status()):
            group.restart()
        if group.num_workers != 2:
            group.rescale(2)
        quiet(group, CLEAR)
    except (GroupError, WorkerError):
        return False
    group._core.history.clear()  # a replacement replays this test's setup cells only, as in a group of its own
    return True


@pytest.fixture(scope="module")
def module_group(ray_session):
    """The module's group, made on first use and handed from test to test (its two ranks start once)."""
    holder = {}
    yield holder
    if holder:
        holder["group"].shutdown()


@pytest.fixture
def group(module_group):
    """A 2-worker group that has run SETUP and one EPOCH, as new as a test can tell: the module's group reset
    (dead ranks restarted, two workers, namespace and history emptied), or a new one where that failed."""
    g = module_group.get("group")
    if g is not None and not _reset(g):
        g.shutdown()
        g = None
    if g is None:
        g = module_group["group"] = WorkerGroup(2, heartbeat_timeout_s=3)
    quiet(g, SETUP)
    quiet(g, EPOCH)
    return g


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_kill_mid_cell_names_the_rank_fast_and_restart_copies_a_peers_state(group):
    sink = MarkSink()
    victim = group.status()[1]
    fired = kill_when(sink, victim.pid)
    with pytest.raises(WorkerError) as info:
        group.run(LOOP_FOREVER, sink=sink, output="all")
    assert time.monotonic() - fired.at < 3.0
    text = info.value.render()
    assert info.value.ranks == [1] and f"rank 1 (pid {victim.pid}, node {victim.node}) died" in text
    assert "%dist_restart" in text and "%dist_rescale" in text and "%dist_rollback" in text
    rows = group.status()
    assert [r.state for r in rows] == ["idle", "dead"]
    with pytest.raises(GroupError, match=r"rank\(s\) 1 are dead or not responding: %dist_restart"):
        quiet(group, "1")
    assert group.restart() == [1]
    assert group.status()[1].pid != victim.pid
    assert_ranks_identical(rank_state(group), "params/momentum/step (a replacement gets the survivor's)")
    assert group.run("rank", ranks=[1], sink=CollectSink()).value == "1"  # its own rank, not copied
    quiet(group, EPOCH)
    assert_ranks_identical(rank_state(group))


def test_kill_while_idle_is_noticed_and_shown_dead(group):
    pid = group.status()[1].pid
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: group.state == "failed", 3.0, "a death while idle to be noticed")
    assert group.status()[1].state == "dead"
    assert group.restart() == [1]
    with pytest.raises(GroupError, match="no dead worker to restart: every rank is alive"):
        group.restart()


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_sigstop_is_reported_after_the_heartbeat_timeout(group):
    sink = MarkSink()
    victim = group.status()[1].pid
    fired = kill_when(sink, victim, signal.SIGSTOP)
    try:
        with pytest.raises(WorkerError) as info:
            group.run(LOOP_FOREVER, sink=sink, output="all")
        assert info.value.type_names == ["WorkerUnresponsiveError"]
        assert "rank 1" in str(info.value) and "has not answered for" in str(info.value)
        assert time.monotonic() - fired.at < 3 + 5
    finally:
        os.kill(victim, signal.SIGCONT)
    group.restart()
    quiet(group, EPOCH)
    assert_ranks_identical(rank_state(group))


def test_rescale_2_1_2_keeps_training_where_it_was(group):
    before = rank_state(group)[0]
    group.rescale(1)
    assert group.num_workers == 1
    assert group.run("(train.get_context().get_world_size(), len(loader), loader.sampler.num_replicas)",
                 sink=CollectSink()).value == "(1, 12, 1)"
    after_shrink = rank_state(group)[0]
    assert same_state((after_shrink[0], after_shrink[2]), (before[0], before[2]))
    quiet(group, EPOCH)
    group.rescale(2)
    ctx = group.run("(train.get_context().get_world_rank(), train.get_context().get_world_size(), len(loader))",
                output="all", sink=CollectSink()).values
    assert [v[0]["text/plain"] for v in ctx.values()] == ["(0, 2, 6)", "(1, 2, 6)"]
    states = rank_state(group)
    assert_ranks_identical(states)
    assert states[0][2] == before[2] + 12
    losses = []
    group.subscribe_metrics(lambda recs: losses.extend(r["metrics"]["loss"] for r in recs if r["rank"] == 0))
    quiet(group, EPOCH)
    assert_ranks_identical(rank_state(group))
    assert losses


def test_a_loader_a_new_rank_receives_from_its_peer_is_resharded_for_it(group):
    # A loader made in a cell that also trained is not remade on a new rank (it replays only that cell's
    # definitions): the rank receives it from its peer on joining, sampler and all. That sampler pointed at the
    # peer's shard (of a 1-worker group here): the two ranks then ran different numbers of DDP steps and the
    # one with more waited forever in backward().
    quiet(group, "loader2 = prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=4, shuffle=True))\n"
                 "train.report({'made': 1})")
    group.rescale(1)
    group.rescale(2)
    shards = group.run("(loader2.sampler.rank, loader2.sampler.num_replicas, sorted(iter(loader2.sampler)))",
                       output="all", sink=CollectSink()).values
    (r0, n0, first), (r1, n1, second) = [eval(v[0]["text/plain"]) for v in shards.values()]
    assert (r0, n0, r1, n1) == (0, 2, 1, 2)
    assert len(first) == len(second) == 24 and not set(first) & set(second)
    quiet(group, EPOCH.replace("in loader:", "in loader2:"))  # the same number of steps on both: it ends


def test_when_every_worker_died_restart_from_a_checkpoint_needs_no_survivor(ray_session):
    group = WorkerGroup(1, heartbeat_timeout_s=3)
    try:
        # a value pushed from the notebook: the new rank gets it again before it replays the setup cell
        group.push(data=torch.utils.data.TensorDataset(torch.randn(48, 10), torch.randn(48, 1)))
        quiet(group, SETUP.replace("data = torch.utils.data.TensorDataset(torch.randn(48, 10), "
                                   "torch.randn(48, 1))\n", ""))
        quiet(group, EPOCH)
        group.checkpoint("before")
        saved = rank_state(group)[0]
        quiet(group, EPOCH)
        os.kill(group.status()[0].pid, signal.SIGKILL)
        with pytest.raises(WorkerError):
            quiet(group, "step")
        with pytest.raises(GroupError, match="no live worker is left to copy the state from: restart from a "
                                             "checkpoint"):
            group.restart()
        assert group.restart(from_checkpoint="before") == [0]
        restored = rank_state(group)[0]
        # the model and optimizer are the snapshot's (plain variables such as step only when named in vars=)
        assert same_state(restored[:2], saved[:2])
        quiet(group, EPOCH)  # and it trains on
    finally:
        group.shutdown()


def test_kill_two_of_three_then_restart_both(ray_session):
    group = WorkerGroup(3, cpus_per_worker=0.5)
    try:
        quiet(group, SETUP)
        quiet(group, EPOCH)
        pids = [r.pid for r in group.status()]
        os.kill(pids[0], signal.SIGKILL)
        os.kill(pids[2], signal.SIGKILL)
        wait_for(lambda: [s.state for s in group.status()] == ["dead", "idle", "dead"], 30, "ranks 0 and 2 to show dead")
        assert group.restart() == [0, 2]
        assert_ranks_identical(rank_state(group))
        quiet(group, EPOCH)
        assert_ranks_identical(rank_state(group))
    finally:
        group.shutdown()


def test_replacement_replays_setup_cells_including_a_later_helper(group):
    quiet(group, "def scaled_step(k):\n    return step * k")  # a setup cell defined after training
    assert [c.setup for c in group.history] == [True, False, True]
    os.kill(group.status()[0].pid, signal.SIGKILL)
    wait_for(lambda: group.status()[0].state == "dead", 30, "rank 0 to show dead")
    group.restart()
    assert group.run("scaled_step(2)", output="all", sink=CollectSink()).values[0][0]["text/plain"] == \
        str(2 * group.pull("step", rank=1))
    quiet(group, EPOCH)
    assert_ranks_identical(rank_state(group))


def test_on_failure_restart_recovers_and_reruns_the_cell(group):
    quiet(group, "epochs_done = 0")
    sink = MarkSink("epoch 1 done")
    kill_when(sink, group.status()[1].pid)
    cell = ("import time\nwhile epochs_done < 4:\n" + "\n".join("    " + l for l in EPOCH.strip().splitlines())
            + "\n    epochs_done += 1\n    print(f'epoch {epochs_done} done', flush=True)\n    time.sleep(0.3)")
    group.run(cell, sink=sink, output="all", on_failure="restart", max_failures=2)
    assert any("--on-failure restart (1/2)" in n for n in sink.notices)
    assert group.pull("epochs_done", rank=None) == [4, 4]
    assert_ranks_identical(rank_state(group))


def test_spare_takes_over_a_dead_rank(ray_session):
    group = WorkerGroup(2, spares=1, cpus_per_worker=0.5)
    try:
        quiet(group, SETUP)
        spare_pid = ray_session.get(group._core.slots.spares[0].actor.warm.remote(), timeout=60)
        os.kill(group.status()[1].pid, signal.SIGKILL)
        wait_for(lambda: group.status()[1].state == "dead", 30, "rank 1 to show dead")
        group.restart()
        assert group.status()[1].pid == spare_pid and len(group._core.slots.spares) == 1
        assert_ranks_identical(rank_state(group))
    finally:
        group.shutdown()


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_rescale_beyond_the_cluster_fails_fast_with_numbers(group):
    start = time.monotonic()
    with pytest.raises(GroupError, match=r"100 workers x 1 CPU = 100 CPU asked, but the cluster has 8 CPU"):
        group.rescale(100)
    assert time.monotonic() - start < 10 and group.num_workers == 2
    with pytest.raises(GroupError, match=r"rescale to 0 workers is not possible"):
        group.rescale(0)
    quiet(group, EPOCH)


#: A cell that sets rank values and trains: a new rank does not replay it, and `ctx`, `is_main` differ by rank.
RANK_VALUES = """
ctx = train.get_context()
rank = ctx.get_world_rank()
world_size = train.get_context().get_world_size()
is_main = rank == 0
""" + EPOCH


def test_rank_values_are_right_on_every_rank_after_a_restart_and_a_rescale(group):
    quiet(group, RANK_VALUES)
    assert not group.history[-1].setup
    os.kill(group.status()[1].pid, signal.SIGKILL)
    wait_for(lambda: group.status()[1].state == "dead", 30, "rank 1 to show dead")
    assert group.restart() == [1]
    assert group.rank_values.reevaluated == ["ctx", "rank", "world_size"] and "is_main" in group.rank_values.dependents
    assert "computed from them, not re-evaluated (run their cells again): is_main" in group.rank_values.summary()
    assert group.pull("rank", rank=None) == [0, 1] and group.pull("world_size", rank=None) == [2, 2]
    assert [c.get_world_rank() for c in group.pull("ctx", rank=None)] == [0, 1]
    group.rescale(3)
    assert group.pull("world_size", rank=None) == [3, 3, 3] and group.pull("rank", rank=None) == [0, 1, 2]
    assert [(c.get_world_rank(), c.get_world_size()) for c in group.pull("ctx", rank=None)] == [(0, 3), (1, 3), (2, 3)]
