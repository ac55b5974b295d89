"""Local mode (``ScalingConfig(num_workers=0)``): the training function in this process, as Ray Train V2 runs it."""
from __future__ import annotations

import os
import socket
import tempfile

import pytest

import raytrain_nb as train
from raytrain_nb import Checkpoint, DataParallelTrainer, RunConfig, ScalingConfig
from raytrain_nb._internal.train import local_mode
from raytrain_nb._internal.worker import session


def _fit(fn, tmp_path, trainer=DataParallelTrainer, **kwargs):
    return trainer(fn, scaling_config=ScalingConfig(num_workers=0),
                   run_config=RunConfig(name="local", storage_path=str(tmp_path / "runs")), **kwargs).fit()


def test_the_function_runs_here_and_the_result_holds_its_last_report_and_return_value(tmp_path):
    seen = {}

    def loop(config):
        ctx = train.get_context()
        seen["context"] = (ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank(),
                           ctx.get_local_world_size(), ctx.get_node_rank(), ctx.get_experiment_name())
        seen["first"] = train.get_checkpoint()
        for step in range(3):
            with tempfile.TemporaryDirectory() as ckpt:  # gone once report() returned: a copy is kept
                with open(os.path.join(ckpt, "step.txt"), "w") as fh:
                    fh.write(str(step))
                train.report({"step": step, "lr": config["lr"]}, checkpoint=Checkpoint.from_directory(ckpt))
            kept = train.get_checkpoint().path
            with open(os.path.join(kept, "step.txt")) as fh:
                seen.setdefault("latest", []).append((fh.read(), kept))
        train.report({"step": 3})
        return {"done": True}

    result = _fit(loop, tmp_path, train_loop_config={"lr": 0.5})
    assert seen["context"] == (0, 1, 0, 1, 0, "local") and seen["first"] is None
    assert [step for step, _ in seen["latest"]] == ["0", "1", "2"]
    copies = [path for _, path in seen["latest"]]
    assert not os.path.exists(copies[0]) and not os.path.exists(copies[1])  # only the last report's is kept
    assert result.metrics == {"step": 3} and result.checkpoint.path == copies[2]
    with result.checkpoint.as_directory() as kept, open(os.path.join(kept, "step.txt")) as fh:
        assert fh.read() == "2"
    assert result.path is None and result.error is None and result.return_value == {"done": True}
    assert result.metrics_dataframe is None and result.best_checkpoints == []
    assert not (tmp_path / "runs").exists()  # no run directory, no lease
    with pytest.raises(RuntimeError, match="works only on a worker"):  # nothing left behind in this process
        train.get_context()


def test_an_error_propagates_as_raised_and_the_process_is_left_as_it_was(tmp_path):
    before = session.WorkerSession(session.TrainContext(3, 4, 1, 2, 1))
    session.set_session(before)
    session.replace_shards({"outer": "it"})
    try:
        def loop():
            assert train.get_context().get_world_size() == 1
            raise KeyError("a bug to debug")

        with pytest.raises(KeyError, match="a bug to debug"):  # no retries, no wrapping: a debugger stops here
            _fit(loop, tmp_path)
        assert session.current_session() is before and session.dataset_shards() == {"outer": "it"}
    finally:
        session.set_session(None)
        session.replace_shards({})


def test_resume_from_checkpoint_until_the_first_report_and_datasets_given_whole(tmp_path):
    start = Checkpoint.from_directory(str(tmp_path))
    trainer = DataParallelTrainer(lambda: [train.get_checkpoint(), train.get_dataset_shard("train")],
                                  scaling_config=ScalingConfig(num_workers=0), resume_from_checkpoint=start)
    trainer.datasets = {"train": ["row0", "row1"]}  # a Ray Data dataset in use; whole, as Ray's local mode
    result = trainer.fit()
    assert result.return_value == [start, ["row0", "row1"]] and result.checkpoint is None and result.metrics is None


def test_a_negative_count_is_refused_and_zero_is_not_elastic():
    with pytest.raises(train.ConfigError, match=r"^ScalingConfig\(num_workers=-2\): pass 1 or more workers, or 0"):
        ScalingConfig(num_workers=-2)
    with pytest.raises(train.ConfigError, match=r"num_workers=\(0, 2\)\): an elastic range needs 1 <= min"):
        ScalingConfig(num_workers=(0, 2))


def test_torchrun_is_detected_only_when_every_variable_is_set():
    env = {name: "0" for name in local_mode.TORCHRUN_VARS}
    assert local_mode.started_by_torchrun(env)
    del env["MASTER_PORT"]
    assert not local_mode.started_by_torchrun(env)


def test_under_torchrun_a_torch_trainer_forms_the_process_group_and_leaves_none(tmp_path, monkeypatch):
    torch_trainer = pytest.importorskip("raytrain_nb.torch").TorchTrainer
    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for name, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                        "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(name, value)

    def loop():
        return dist.is_initialized(), dist.get_backend(), train.get_context().get_world_size()

    result = _fit(loop, tmp_path, trainer=torch_trainer)
    assert result.return_value == (True, "gloo", 1) and not dist.is_initialized()
    # a framework-neutral trainer forms none, as Ray's LocalController
    assert _fit(lambda: dist.is_initialized(), tmp_path).return_value is False


def test_a_report_of_something_else_than_a_checkpoint_is_named(tmp_path):
    with pytest.raises(TypeError, match=r"^report\(checkpoint=\.\.\.\) takes a raytrain_nb.Checkpoint, got str: pass "
                                        r"Checkpoint.from_directory\(path\)$"):
        _fit(lambda: train.report({"a": 1}, checkpoint="/tmp/x"), tmp_path)
