"""Checkpoints you can trust, on a real group: a checkpoint one rank never reported is never
committed (the resume starts from the one before), a cell on some ranks cannot report one, and an
interrupted start leaves no placement group behind."""
from __future__ import annotations

import _thread
import json
import os
import signal
import tempfile
import threading
import time

import pytest

from raytrain_nb import CheckpointError, FailureConfig, RunConfig, ScalingConfig, WorkerError, WorkerGroup
from raytrain_nb.torch import TorchTrainer

from ..groups import quiet
from ..waiting import wait_for

pytestmark = pytest.mark.ray


def _epoch_loop(config):
    """A Ray Train quickstart's shape: every rank reports each epoch, rank 0 with the checkpoint.

    On the first attempt rank 1 dies at epoch 2 after rank 0 reported epoch 2's checkpoint and
    before rank 1's own report()."""
    import torch.distributed as dist

    import raytrain_nb as train
    from raytrain_nb import Checkpoint

    rank = train.get_context().get_world_rank()
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as d:
            with open(os.path.join(d, "state.json")) as fh:
                start = json.load(fh)["epoch"] + 1
    for epoch in range(start, 4):
        dist.barrier()  # ranks step in lockstep, as DDP training does
        first_attempt = not os.path.exists(os.path.join(config["dir"], "killed"))
        if epoch == 2 and rank == 1 and first_attempt:
            deadline = time.monotonic() + 60
            while not os.path.exists(os.path.join(config["dir"], "rank0-reported")):
                assert time.monotonic() < deadline, "rank 0 never reported epoch 2"
                time.sleep(0.02)
            open(os.path.join(config["dir"], "killed"), "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        with tempfile.TemporaryDirectory() as d:
            ckpt = None
            if rank == 0:
                with open(os.path.join(d, "state.json"), "w") as fh:
                    json.dump({"epoch": epoch}, fh)
                ckpt = Checkpoint.from_directory(d)
            train.report({"epoch": epoch, "start": start}, checkpoint=ckpt)
        if rank == 0 and epoch == 2:
            open(os.path.join(config["dir"], "rank0-reported"), "w").close()


def test_a_crash_between_two_ranks_reports_resumes_from_the_checkpoint_before(ray_session, tmp_path):
    trainer = TorchTrainer(_epoch_loop, train_loop_config={"dir": str(tmp_path)},
                           scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name="crash-between-reports", storage_path=str(tmp_path / "runs"),
                                                failure_config=FailureConfig(max_failures=1), verbose=0))
    result = trainer.fit()
    assert os.path.exists(tmp_path / "killed")  # rank 1 did die after rank 0's report of epoch 2
    # epoch 2's checkpoint lacked rank 1's report: discarded, so the second attempt resumed after epoch 1
    assert result.metrics == {"epoch": 3, "start": 2}
    names = [p.name for p in (tmp_path / "runs" / "crash-between-reports").iterdir() if p.name.startswith("checkpoint_")]
    with result.checkpoint.as_directory() as d:
        assert json.load(open(os.path.join(d, "state.json")))["epoch"] == 3
    assert len(names) == len(set(names))


def test_a_cell_on_some_ranks_cannot_report_a_checkpoint(group):
    source = ("import tempfile, raytrain_nb as train\nfrom raytrain_nb import Checkpoint\n"
              "with tempfile.TemporaryDirectory() as d:\n"
              "    train.report({'x': 1}, checkpoint=Checkpoint.from_directory(d))")
    before = len(group.checkpoints("reported"))
    start = time.monotonic()
    with pytest.raises(WorkerError, match=r"report\(checkpoint=\.\.\.\) needs every rank: this cell runs on some "
                                          r"ranks only \(--ranks"):
        quiet(group, source, ranks=[0])
    assert time.monotonic() - start < 30
    assert len(group.checkpoints("reported")) == before
    quiet(group, "1")  # the group is fine


def _live_placement_groups(ray):
    return {pg_id for pg_id, info in ray.util.placement_group_table().items() if info.get("state") != "REMOVED"}


def test_ctrl_c_while_waiting_for_resources_leaves_no_placement_group(group, ray_session, tmp_path):
    before = _live_placement_groups(ray_session)
    done = threading.Event()

    def ctrl_c_once_it_waits() -> None:
        # Ctrl-C while the new group waits for CPUs: once its placement group is in Ray's table (a fixed delay
        # does not say that the wait has begun)
        wait_for(lambda: done.is_set() or _live_placement_groups(ray_session) - before, 60,
                 "the new group's placement group")
        if not done.is_set():
            _thread.interrupt_main()

    pressing = threading.Thread(target=ctrl_c_once_it_waits, daemon=True)
    pressing.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            # feasible on this cluster (8 CPUs) but not now: the shared group holds 2 of them
            WorkerGroup(2, cpus_per_worker=4, placement_timeout_s=120, storage_path=str(tmp_path), activate=False)
    finally:
        done.set()
        pressing.join(timeout=10)
    wait_for(lambda: _live_placement_groups(ray_session) == before, 10, "the placement group to be removed")


def test_a_run_name_that_leaves_the_storage_root_is_refused_before_anything_is_made(ray_session, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    for name in ("../x", "a/../../x", "/abs", ".."):
        with pytest.raises(CheckpointError, match=r"run name .* is not allowed"):
            WorkerGroup(1, name=name, storage_path=str(root), activate=False)
    assert sorted(os.listdir(tmp_path)) == ["root"] and os.listdir(root) == []
