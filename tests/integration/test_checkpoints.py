"""Snapshots, rollback and reported checkpoints on a real group."""
from __future__ import annotations

import os
import signal
import threading

import pytest

from raytrain_nb import WorkerGroup
from raytrain_nb._internal.errors import CheckpointError, GroupError, StorageError
from raytrain_nb._internal.output import CollectSink

from ..groups import quiet, same_state
from ..waiting import wait_for

SETUP = """
import os, tempfile, torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
torch.manual_seed(0)
rank = train.get_context().get_world_rank()
model = prepare_model(torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
step = 0
"""
TRAIN = """
for _ in range({n}):
    loss = model(torch.randn(16, 10)).pow(2).mean()   # torch RNG: restored by rollback too
    opt.zero_grad(); loss.backward(); opt.step(); sched.step()
    step += 1
"""
STATE = ("([p.detach().clone() for p in model.parameters()], "
         "[s['momentum_buffer'].clone() for s in opt.state.values()], sched.last_epoch)")


def state_by_rank(group):
    group.run(f"_state = {STATE}", sink=CollectSink())
    return group.pull("_state", rank=None)


@pytest.fixture(scope="module")
def group(ray_session, tmp_path_factory):
    group = WorkerGroup(2, storage_path=str(tmp_path_factory.mktemp("runs")), name="ckpt-run",
                        num_to_keep=2, checkpoint_score_attribute="acc")
    quiet(group, SETUP)
    quiet(group, TRAIN.format(n=4))
    yield group
    group.shutdown()


def test_round_trip_restores_parameters_and_optimizer_state_in_place(group):
    before = state_by_rank(group)
    entry = group.checkpoint(name="round-trip", vars=["step"])
    assert entry.kind == "snapshot" and entry.size_bytes > 0
    ids = group.run("(id(model), id(opt), id(sched))", output="all", sink=CollectSink()).values
    quiet(group, TRAIN.format(n=3))
    after_a = state_by_rank(group)
    assert not same_state(after_a[0], before[0])
    result = group.rollback("round-trip")
    assert set(result.restored) >= {"model", "opt", "sched", "step"}
    rolled = state_by_rank(group)
    assert all(same_state(r, b) for r, b in zip(rolled, before)), "rollback did not restore params+momentum"
    assert group.run("(id(model), id(opt), id(sched))", output="all", sink=CollectSink()).values == ids
    assert group.pull("step") == 4
    quiet(group, TRAIN.format(n=3))  # same RNG, same data: training matches the run that never diverged
    again = state_by_rank(group)
    assert all(same_state(x, y) for x, y in zip(again, after_a))


def test_rollback_lists_plain_variables_that_changed(group):
    group.checkpoint(name="vars-check")
    quiet(group, "step += 10\nnote = 'new'")
    result = group.rollback("vars-check")
    assert result.changed == ["note", "step"] and "step" in str(result)
    quiet(group, "del note")


def test_async_save_writes_the_state_at_the_call(group):
    before = state_by_rank(group)
    assert group.checkpoint(name="async-one", blocking=False) is None
    quiet(group, TRAIN.format(n=5))  # trains while the snapshot is written
    assert "async-one" in [e.name for e in group.checkpoints()]
    second = state_by_rank(group)
    assert not all(same_state(r, b) for r, b in zip(second, before))
    # the second copy goes into the first one's buffers, once that one is written: it holds its own call's state
    assert group.checkpoint(name="async-two", blocking=False) is None
    quiet(group, TRAIN.format(n=5))
    assert "async-two" in [e.name for e in group.checkpoints()]
    group.rollback("async-two")
    assert all(same_state(r, b) for r, b in zip(state_by_rank(group), second))
    group.rollback("async-one")
    assert all(same_state(r, b) for r, b in zip(state_by_rank(group), before))


class StartedSink(CollectSink):
    """Sets ``started`` at the cell's first output line."""

    def __init__(self):
        super().__init__()
        self.started = threading.Event()

    def stream(self, rank, name, text, label):
        super().stream(rank, name, text, label)
        self.started.set()


def test_snapshot_mid_cell_is_taken_at_a_report(group, tmp_path):
    box = {}
    sink = StartedSink()
    started = sink.started
    done_flag = tmp_path / "snapshot-taken"

    def take():
        started.wait(60)
        try:
            box["entry"] = group.checkpoint(name="mid-cell", vars=["step"], timeout_s=120)
        finally:
            done_flag.touch()  # the cell trains, reporting each step, until the snapshot is in

    t = threading.Thread(target=take)
    t.start()
    group.run(f"import os, time\nprint('go', flush=True)\nwhile not os.path.exists({str(done_flag)!r}):\n"
          "    time.sleep(0.05)\n    step += 1\n    train.report({'step': step})", sink=sink)
    t.join(60)
    quiet(group, "step = -1")
    group.rollback("mid-cell")
    restored = group.pull("step", rank=None)
    assert restored[0] == restored[1] and restored[0] > 0, "the snapshot was not taken at a step boundary"


def test_snapshot_mid_cell_without_report_fails_with_the_reason(group):
    errors = []
    sink = StartedSink()
    started = sink.started

    def take():
        started.wait(60)
        try:
            group.checkpoint(name="never", timeout_s=1)
        except CheckpointError as exc:
            errors.append(str(exc))

    t = threading.Thread(target=take)
    t.start()
    group.run("import time\nprint('go', flush=True)\ntime.sleep(4)", sink=sink)
    t.join(30)
    assert errors and "no report() came on every rank within 1 s" in errors[0]
    assert "never" not in [e.name for e in group.checkpoints()]


def test_reported_checkpoints_ranked_pruned_and_snapshots_kept(group):
    snapshots = [e.name for e in group.checkpoints("snapshot")]
    quiet(group, """
for acc in [0.5, 0.9, 0.1, 0.7]:
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, f"rank{rank}.txt"), "w") as f:
            f.write(str(acc))
        train.report({"acc": acc, "step": step}, checkpoint=train.Checkpoint.from_directory(d))
""")
    reported = group.checkpoints("reported")
    assert [e.metrics["acc"] for e in reported] == [0.9, 0.7]  # best by acc, and the latest
    assert [e.name for e in group.checkpoints("snapshot")] == snapshots
    files = sorted(os.listdir(reported[-1].path))
    assert "rank0.txt" in files and "rank1.txt" in files  # files of every rank merge
    latest = group.run("ck = train.get_checkpoint(); open(os.path.join(ck.path, 'rank1.txt')).read()",
                   sink=CollectSink()).value
    assert latest == "'0.7'"
    from raytrain_nb._internal.checkpoint.metrics_log import read_metrics

    assert [m["acc"] for m in read_metrics(group.run_storage.url) if "acc" in m][-4:] == [0.5, 0.9, 0.1, 0.7]


def test_listing_and_rolling_back_from_a_new_group(group, tmp_path):
    group.checkpoint(name="for-new-group")
    saved = state_by_rank(group)[0]
    other = WorkerGroup(1, storage_path=group.storage_path, name="second-run", activate=False)
    try:
        quiet(other, SETUP)
        from raytrain_nb._internal.checkpoint.manager import CheckpointManager

        names = [e.name for e in CheckpointManager.load(os.path.join(group.storage_path, "ckpt-run")).list()]
        assert "for-new-group" in names
        other.rollback("for-new-group", run="ckpt-run")
        assert same_state(state_by_rank(other)[0], saved)
    finally:
        other.shutdown()


def test_bad_rollbacks_say_what_is_wrong(group):
    with pytest.raises(CheckpointError, match=r"no checkpoint named 'nope'.*round-trip"):
        group.rollback("nope")
    reported = group.checkpoints("reported")[-1].name
    with pytest.raises(CheckpointError, match="is a reported checkpoint"):
        group.rollback(reported)
    entry = group.checkpoint(name="to-damage")
    with open(os.path.join(entry.path, "replicated.pt"), "r+b") as f:
        f.truncate(100)
    before = state_by_rank(group)
    with pytest.raises(CheckpointError, match=r"replicated.pt has 100 bytes but had \d+ when committed"):
        group.rollback("to-damage")  # found once, on the driver, before any rank loads
    assert all(same_state(a, b) for a, b in zip(state_by_rank(group), before)), "a damaged file was half-loaded"
    group.checkpoint(name="lost-object")
    quiet(group, "sched2 = sched\ndel sched")
    with pytest.raises(GroupError, match=r"sched \(scheduler\) no longer exist"):
        group.rollback("lost-object")
    quiet(group, "sched = sched2\ndel sched2")


def test_optimizer_of_an_unnamed_model_is_refused(group):
    quiet(group, "orphan = torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)")
    with pytest.raises(GroupError, match=r"optimizer 'orphan' optimizes parameters of no model"):
        group.checkpoint(name="orphaned")
    with pytest.raises(GroupError, match=r"optimizer 'orphan' optimizes parameters of no model"):
        group.checkpoint(name="orphaned", blocking=False)  # at the call, though the copy is taken after it
    with pytest.raises(GroupError, match=r"--vars names variable\(s\) nope that do not exist"):
        group.checkpoint(name="orphaned", vars=["nope"], blocking=False)
    quiet(group, "del orphan")
    assert "orphaned" not in [e.name for e in group.checkpoints()]


def test_storage_errors_are_one_line(ray_session, tmp_path):
    with pytest.raises(StorageError, match=r"memory:///runs cannot be a worker group's storage: .*one process"):
        WorkerGroup(1, storage_path="memory://runs", activate=False)
    with pytest.raises(StorageError, match=r"nosuchproto"):
        WorkerGroup(1, storage_path="nosuchproto://bucket/runs", activate=False)
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    with pytest.raises(StorageError, match=r"cannot create the run directory .*a-file/r1: .*writable --storage"):
        WorkerGroup(1, storage_path=str(blocker), name="r1", activate=False)


def test_worker_killed_while_writing_leaves_previous_snapshot_loadable(ray_session, tmp_path):
    group = WorkerGroup(2, storage_path=str(tmp_path), name="kill-run")
    try:
        quiet(group, SETUP)
        good = group.checkpoint(name="good")
        saved = state_by_rank(group)

        def slow_write(taken, staged):
            import time as _t

            with staged.open("replicated.pt") as fh:
                fh.write(b"partial")
                fh.flush()
                _t.sleep(600)

        group.execute(lambda: setattr(__import__("raytrain_nb._internal.worker.snapshot_io", fromlist=["x"]),
                                      "write", slow_write), ranks=[0])
        group.checkpoint(name="partial", blocking=False)
        staging = tmp_path / "kill-run" / ".staging"
        wait_for(lambda: any((p / "replicated.pt").exists() for p in staging.glob("partial-*")), 60,
                 "the background snapshot to start writing", interval=0.01)
        os.kill(group.status()[0].pid, signal.SIGKILL)
        assert [e.name for e in group.checkpoints()] == ["good"]  # waits for the background write
        assert not list(staging.glob("partial-*")), "the partial snapshot was left behind"
        wait_for(lambda: group.status()[0].state == "dead", 30, "rank 0 to show dead")
        group.restart()
        sink = CollectSink()
        group.run(TRAIN.format(n=2), sink=sink)
        assert any("background checkpoint failed" in n and "partial: a worker died while writing it" in n
                   for n in sink.notices)
        group.rollback("good")
        assert all(same_state(a, b) for a, b in zip(state_by_rank(group), saved))
    finally:
        group.shutdown()
