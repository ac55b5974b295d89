"""On a real local Ray instance: a worker killed during an ASYNC upload leaves no committed partial checkpoint, and
fit() resumes from the newest complete one (TorchTrainer, FailureConfig(max_failures=1)); a validation task that
cannot start says so in one line, and its timeout is recorded on the checkpoint."""
from __future__ import annotations

import os
import sys

import pytest

from raytrain_nb import CheckpointUploadMode, FailureConfig, RunConfig, ScalingConfig
from raytrain_nb._internal.checkpoint import reported
from raytrain_nb._internal.checkpoint.manager import CheckpointManager
from raytrain_nb.torch import TorchTrainer

from ..groups import pickled_by_value

pytestmark = pytest.mark.ray


class DiesWhenWritten:
    """A metric whose text (written into rank 1's upload marker, after its files were copied and before the upload
    is marked done) kills the worker: rank 1 dies in the middle of its ASYNC upload, deterministically."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __str__(self) -> str:
        if not os.path.exists(self.marker):
            open(self.marker, "w").close()
            os.kill(os.getpid(), 9)
        return "survived"


def loop(config):
    import tempfile

    import raytrain_nb as train

    rank = train.get_context().get_world_rank()
    start = 0
    latest = train.get_checkpoint()
    if latest is not None:
        with latest.as_directory() as d:
            start = int(open(os.path.join(d, f"epoch-{rank}.txt")).read()) + 1
    print(f"start_epoch={start}")
    for epoch in range(start, 3):
        tmp = tempfile.mkdtemp()
        with open(os.path.join(tmp, f"epoch-{rank}.txt"), "w") as f:
            f.write(str(epoch))
        metrics = {"epoch": epoch}
        if epoch == 1 and rank == 1:
            metrics["note"] = DiesWhenWritten(config["marker"])
        train.report(metrics, checkpoint=train.Checkpoint.from_directory(tmp), checkpoint_dir_name=f"epoch_{epoch}",
                     checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
    return start


@pytest.fixture(scope="module", autouse=True)
def by_value(ray_session):
    with pickled_by_value(sys.modules[__name__]):
        yield


def test_a_rank_killed_mid_async_upload_commits_nothing_partial_and_fit_resumes_from_the_newest_complete(tmp_path):
    marker = str(tmp_path / "killed-once")
    result = TorchTrainer(loop, train_loop_config={"marker": marker}, scaling_config=ScalingConfig(num_workers=2),
                          run_config=RunConfig(name="async-kill", storage_path=str(tmp_path),
                                               failure_config=FailureConfig(max_failures=1))).fit()
    assert os.path.exists(marker)  # rank 1 did die in its upload of epoch_1
    assert result.return_value == 1  # the second attempt started after epoch_0, the newest complete checkpoint
    names = [e.name for e in CheckpointManager.load(result.path).list("reported")]
    assert names == ["epoch_0", "epoch_1", "epoch_2"], names  # epoch_1 is the second attempt's, whole
    with result.checkpoint.as_directory() as d:
        assert sorted(f for f in os.listdir(d) if not f.startswith(".")) == ["epoch-0.txt", "epoch-1.txt"]
    epoch_1 = CheckpointManager.load(result.path).get("epoch_1").checkpoint
    with epoch_1.as_directory() as d:
        assert sorted(f for f in os.listdir(d) if not f.startswith(".")) == ["epoch-0.txt", "epoch-1.txt"]
    assert reported.pending_names(result.path) == []  # the partial set was discarded, nothing waits


def test_a_validation_that_cannot_start_says_so_in_one_line_and_its_timeout_is_recorded(tmp_path, caplog):
    from raytrain_nb._internal.checkpoint.run_storage import RunStorage
    from raytrain_nb._internal.group import validations

    run = RunStorage(str(tmp_path), "no-cpu")
    try:
        local = tmp_path / "local"
        local.mkdir()
        (local / "w.bin").write_bytes(b"w")
        staged = reported.report_staging(run.url, reported.report_name(1), "epoch_0")
        reported.upload(staged, 0, str(local), {"epoch": 0}, world_size=1)
        found = validations.attach(run, lambda checkpoint: {"val": 1.0}, ray_remote_kwargs={"num_cpus": 10_000})
        record = {"rank": 0, "report": reported.report_name(1), "checkpoint": True, "time": 0.0,
                  "metrics": {"epoch": 0}, "dir": "epoch_0", "validation": {"fn_kwargs": None, "timeout_s": 3}}
        with caplog.at_level("WARNING", logger="raytrain_nb"):
            run.on_records([record], world_size=1)
            assert found.wait(60)
        said = [r.getMessage() for r in caplog.records if "waits for 10000 CPU" in r.getMessage()]
        assert len(said) == 1 and "\n" not in said[0] and "the validation of epoch_0" in said[0], said
        entry = run.manager.get("epoch_0")
        assert entry.validation == {"status": "timeout", "error": "took more than timeout_s=3"}
    finally:
        run.close()
