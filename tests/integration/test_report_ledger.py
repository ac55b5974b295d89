"""A rank SIGKILLed right after its report() returned still counts as having reported: its ledger entry,
written before report() returned, outlives the process, so the checkpoint every rank reported is committed
after the crash (on a real group, and through a trainer's restart), though the rank's record never reached
the driver (these tests take it from the rank's queue before the kill, as a kill before the driver's next
poll does)."""
from __future__ import annotations

import json
import os
import pathlib
import signal
import time

import pytest

from raytrain_nb import FailureConfig, RunConfig, ScalingConfig, WorkerError, WorkerGroup
from raytrain_nb._internal.checkpoint import reported
from raytrain_nb.torch import TorchTrainer

from ..groups import quiet
from ..waiting import wait_for

pytestmark = pytest.mark.ray

#: Rank 0 reports a checkpoint; rank 1 waits for that, reports (no files), loses its record and is killed.
REPORT_THEN_DIE = """
import os, signal, tempfile, time
import raytrain_nb as train
from raytrain_nb import Checkpoint
from raytrain_nb._internal.worker.session import current_session
rank = train.get_context().get_world_rank()
with tempfile.TemporaryDirectory() as d:
    if rank == 0:
        open(os.path.join(d, "state.txt"), "w").write("step 1")
        train.report({"step": 1}, checkpoint=Checkpoint.from_directory(d))
        open(os.path.join(DIR, "rank0-reported"), "w").close()
    else:
        deadline = time.monotonic() + 60
        while not os.path.exists(os.path.join(DIR, "rank0-reported")):
            assert time.monotonic() < deadline, "rank 0 never reported"
            time.sleep(0.02)
        train.report({"step": 1})
        current_session().drain()  # the record dies with the process: the driver never gets it
        os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_rank_killed_right_after_report_returned_counts_and_the_checkpoint_commits(ray_session, tmp_path):
    group = WorkerGroup(2, backend="none", storage_path=str(tmp_path / "runs"), name="ledger-kill")
    try:
        quiet(group, f"DIR = {str(tmp_path)!r}")
        base = group.run_storage.report_base
        with pytest.raises(WorkerError):
            quiet(group, REPORT_THEN_DIE)
        assert reported.ledger_ranks(group.run_storage.url, base, 2) == [0, 1]  # both ranks' evidence is on disk
        assert group.checkpoints("reported") == []  # not committed live: rank 1's record never came
        wait_for(lambda: group.status()[1].state == "dead", 30, "rank 1 to show dead")
        assert group.restart() == [1]
        names = [c.name for c in group.checkpoints("reported")]
        assert names == [reported.report_name(base)]  # committed on the ledger's evidence
        with group.checkpoints("reported")[0].checkpoint.as_directory() as d:
            assert open(os.path.join(d, "state.txt")).read() == "step 1"
    finally:
        group.shutdown()


def _saved_epoch(checkpoint) -> int:
    with checkpoint.as_directory() as d:
        return json.loads(pathlib.Path(d, "state.json").read_text())["epoch"]


def _epoch_loop(config):
    """Every rank reports each epoch, rank 0 with the checkpoint. On the first attempt rank 1 is killed at
    epoch 2 right after its own report() returned (its record taken from its queue first)."""
    import torch.distributed as dist

    import raytrain_nb as train
    from raytrain_nb import Checkpoint
    from raytrain_nb._internal.worker.session import current_session

    rank = train.get_context().get_world_rank()
    found = train.get_checkpoint()
    start = _saved_epoch(found) + 1 if found is not None else 0
    marks = pathlib.Path(config["dir"])
    for epoch in range(start, 4):
        dist.barrier()
        dies = epoch == 2 and rank == 1 and not (marks / "killed").exists()
        deadline = time.monotonic() + 60
        while dies and not (marks / "rank0-reported").exists():  # rank 0's files are all uploaded first
            assert time.monotonic() < deadline, "rank 0 never reported epoch 2"
            time.sleep(0.02)
        files = marks / f"rank0-epoch{epoch}"
        if rank == 0:
            files.mkdir(exist_ok=True)
            (files / "state.json").write_text(json.dumps({"epoch": epoch}))
        train.report({"epoch": epoch, "start": start}, checkpoint=Checkpoint.from_directory(str(files)) if rank == 0
                     else None)
        if dies:
            current_session().drain()
            (marks / "killed").touch()
            os.kill(os.getpid(), signal.SIGKILL)
        if rank == 0 and epoch == 2:
            (marks / "rank0-reported").touch()


def test_a_trainer_resumes_after_the_report_a_rank_made_just_before_it_was_killed(ray_session, tmp_path):
    one_retry = RunConfig(name="killed-after-report", storage_path=str(tmp_path / "runs"), verbose=0,
                          failure_config=FailureConfig(max_failures=1))
    result = TorchTrainer(_epoch_loop, scaling_config=ScalingConfig(num_workers=2), run_config=one_retry,
                          train_loop_config={"dir": str(tmp_path)}).fit()
    assert os.path.exists(tmp_path / "killed")  # rank 1 did die right after its report of epoch 2
    # every rank reported epoch 2 (rank 1 by its ledger only): committed, so the second attempt began at 3
    assert result.metrics == {"epoch": 3, "start": 3}
    assert _saved_epoch(result.checkpoint) == 3
