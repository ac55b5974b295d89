"""Real worker deaths: detection, restart from a live peer, rescale, automatic recovery, spares."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from raytrain_nb import GroupError, WorkerError, WorkerGroup
from raytrain_nb._internal.output import CollectSink

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


def quiet(g, src, **kw):
    return g.run(src, sink=CollectSink(), **kw)


class MarkSink(CollectSink):
    def __init__(self, marker="training"):
        super().__init__()
        self.seen = threading.Event()
        self.marker = marker

    def stream(self, rank, name, text, label):
        super().stream(rank, name, text, label)
        if self.marker in text:
            self.seen.set()


def rank_state(g):
    g.run("_s = ([p.detach().clone() for p in model.parameters()], "
          "[v['momentum_buffer'].clone() for v in opt.state.values()], step)", sink=CollectSink())
    return g.pull("_s", rank=None)


def identical(states):
    first = states[0]
    return all(s[2] == first[2] and all(torch.equal(a, b) for a, b in zip(s[0] + s[1], first[0] + first[1]))
               for s in states[1:])


def kill_when(sink, pid, sig=signal.SIGKILL):
    def fire():
        sink.seen.wait(60)
        os.kill(pid, sig)
        fire.at = time.monotonic()

    fire.at = None
    threading.Thread(target=fire, daemon=True).start()
    return fire


@pytest.fixture
def g(ray_session):
    group = WorkerGroup(2, heartbeat_timeout_s=3)
    quiet(group, SETUP)
    quiet(group, EPOCH)
    yield group
    group.shutdown()


def test_kill_mid_cell_names_the_rank_fast_and_restart_copies_a_peers_state(g):
    sink = MarkSink()
    victim = g.status()[1]
    fired = kill_when(sink, victim.pid)
    with pytest.raises(WorkerError) as info:
        g.run(LOOP_FOREVER, sink=sink, output="all")
    assert time.monotonic() - fired.at < 3.0
    text = info.value.render()
    assert info.value.ranks == [1] and f"rank 1 (pid {victim.pid}, node {victim.node}) died" in text
    assert "%dist_restart" in text and "%dist_rescale" in text and "%dist_rollback" in text
    rows = g.status()
    assert [r.state for r in rows] == ["idle", "dead"]
    with pytest.raises(GroupError, match=r"rank\(s\) 1 are dead or not responding: %dist_restart"):
        quiet(g, "1")
    assert g.restart() == [1]
    assert g.status()[1].pid != victim.pid
    assert identical(rank_state(g)), "the replacement did not get the survivor's params/momentum/step"
    assert g.run("rank", ranks=[1], sink=CollectSink()).value == "1"  # its own rank, not copied
    quiet(g, EPOCH)
    assert identical(rank_state(g))


def test_kill_while_idle_is_noticed_and_shown_dead(g):
    pid = g.status()[1].pid
    os.kill(pid, signal.SIGKILL)
    start = time.monotonic()
    while g.state.value != "failed":
        assert time.monotonic() - start < 3.0, "a death while idle was not noticed within 3 s"
    assert g.status()[1].state == "dead"
    assert g.restart() == [1]
    with pytest.raises(GroupError, match="no dead worker to restart: every rank is alive"):
        g.restart()


def test_sigstop_is_reported_after_the_heartbeat_timeout(g):
    sink = MarkSink()
    victim = g.status()[1].pid
    fired = kill_when(sink, victim, signal.SIGSTOP)
    try:
        with pytest.raises(WorkerError) as info:
            g.run(LOOP_FOREVER, sink=sink, output="all")
        assert info.value.type_names == ["WorkerUnresponsiveError"]
        assert "rank 1" in str(info.value) and "has not answered for" in str(info.value)
        assert time.monotonic() - fired.at < 3 + 5
    finally:
        os.kill(victim, signal.SIGCONT)
    g.restart()
    quiet(g, EPOCH)
    assert identical(rank_state(g))


def test_rescale_2_1_2_keeps_training_where_it_was(g):
    before = rank_state(g)[0]
    g.rescale(1)
    assert g.num_workers == 1
    assert g.run("(train.get_context().get_world_size(), len(loader), loader.sampler.num_replicas)",
                 sink=CollectSink()).value == "(1, 12, 1)"
    after_shrink = rank_state(g)[0]
    assert after_shrink[2] == before[2] and all(torch.equal(a, b) for a, b in zip(after_shrink[0], before[0]))
    quiet(g, EPOCH)
    g.rescale(2)
    ctx = g.run("(train.get_context().get_world_rank(), train.get_context().get_world_size(), len(loader))",
                output="all", sink=CollectSink()).values
    assert [v[0]["text/plain"] for v in ctx.values()] == ["(0, 2, 6)", "(1, 2, 6)"]
    states = rank_state(g)
    assert identical(states) and states[0][2] == before[2] + 12
    losses = []
    g.subscribe_metrics(lambda recs: losses.extend(r["metrics"]["loss"] for r in recs if r["rank"] == 0))
    quiet(g, EPOCH)
    assert identical(rank_state(g)) and losses


def test_kill_two_of_three_then_restart_both(ray_session):
    g = WorkerGroup(3, cpus_per_worker=0.5)
    try:
        quiet(g, SETUP)
        quiet(g, EPOCH)
        pids = [r.pid for r in g.status()]
        os.kill(pids[0], signal.SIGKILL)
        os.kill(pids[2], signal.SIGKILL)
        while [s.state for s in g.status()] != ["dead", "idle", "dead"]:
            pass
        assert g.restart() == [0, 2]
        assert identical(rank_state(g))
        quiet(g, EPOCH)
        assert identical(rank_state(g))
    finally:
        g.shutdown()


def test_replacement_replays_setup_cells_including_a_later_helper(g):
    quiet(g, "def scaled_step(k):\n    return step * k")  # a setup cell defined after training
    assert [c.setup for c in g.history] == [True, False, True]
    os.kill(g.status()[0].pid, signal.SIGKILL)
    while g.status()[0].state != "dead":
        pass
    g.restart()
    assert g.run("scaled_step(2)", output="all", sink=CollectSink()).values[0][0]["text/plain"] == \
        str(2 * g.pull("step", rank=1))
    quiet(g, EPOCH)
    assert identical(rank_state(g))


def test_on_failure_restart_recovers_and_reruns_the_cell(g):
    quiet(g, "epochs_done = 0")
    sink = MarkSink("epoch 1 done")
    kill_when(sink, g.status()[1].pid)
    cell = ("import time\nwhile epochs_done < 4:\n" + "\n".join("    " + l for l in EPOCH.strip().splitlines())
            + "\n    epochs_done += 1\n    print(f'epoch {epochs_done} done', flush=True)\n    time.sleep(0.3)")
    g.run(cell, sink=sink, output="all", on_failure="restart", max_failures=2)
    assert any("--on-failure restart (1/2)" in n for n in sink.notices)
    assert g.pull("epochs_done", rank=None) == [4, 4]
    assert identical(rank_state(g))


def test_spare_takes_over_a_dead_rank(ray_session):
    g = WorkerGroup(2, spares=1, cpus_per_worker=0.5)
    try:
        quiet(g, SETUP)
        spare_pid = g._get([g._spares[0].actor.warm.remote()], 60, "start")[0]
        os.kill(g.status()[1].pid, signal.SIGKILL)
        while g.status()[1].state != "dead":
            pass
        g.restart()
        assert g.status()[1].pid == spare_pid and len(g._spares) == 1
        assert identical(rank_state(g))
    finally:
        g.shutdown()


def test_rescale_beyond_the_cluster_fails_fast_with_numbers(g):
    start = time.monotonic()
    with pytest.raises(GroupError, match=r"100 workers x 1 CPU = 100 CPU asked, but the cluster has 8 CPU"):
        g.rescale(100)
    assert time.monotonic() - start < 10 and g.num_workers == 2
    with pytest.raises(GroupError, match=r"rescale to 0 workers is not possible"):
        g.rescale(0)
    quiet(g, EPOCH)
