"""Ray Train V2's results guide: what ``trainer.fit()`` returns (metrics, checkpoints, the function's return value on
rank 0, the run's path) and, when training fails, the ``TrainingFailedError`` it raises, caught as a
``WorkerGroupError`` whose ``worker_failures`` maps each failed rank to its exception.

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports. The guide's
``ray.train.<name>`` is spelled ``train.<name>`` here (``import ray.train as train``), and its
``DataParallelTrainer`` is ``TorchTrainer``.
"""
import tempfile
from pathlib import Path

import ray.train as train
from ray.train import Result, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def train_fn(config):
    for i in range(3):
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            Path(temp_checkpoint_dir).joinpath("model.pt").touch()
            train.report(
                {"loss": i},
                checkpoint=train.Checkpoint.from_directory(temp_checkpoint_dir),
            )
    # Any data returned by the training function (on worker 0 only) is in Result.return_value
    return {"final_loss": 2, "rank": train.get_context().get_world_rank()}


def error_train_fn(config):
    raise RuntimeError("Simulated training error")


if __name__ == "__main__":
    trainer = TorchTrainer(train_fn, scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name=f"results-{Path(tempfile.mkdtemp()).name}"))
    result = trainer.fit()
    print("Observed metrics:", result.metrics)
    df = result.metrics_dataframe
    print("Minimum loss", min(df["loss"]))
    print("Last checkpoint:", result.checkpoint)
    with result.checkpoint.as_directory() as tmpdir:
        assert (Path(tmpdir) / "model.pt").exists()
    for checkpoint, metrics in result.best_checkpoints:
        print("Loss", metrics["loss"], "checkpoint", checkpoint)
    print("Returned:", result.return_value)
    assert result.return_value == {"final_loss": 2, "rank": 0}, result.return_value
    restored_result = Result.from_path(result.path)
    print("Restored loss", restored_result.metrics["loss"])
    assert restored_result.metrics["loss"] == 2

    trainer = TorchTrainer(error_train_fn, scaling_config=ScalingConfig(num_workers=1))
    try:
        result = trainer.fit()
    except train.TrainingFailedError as e:
        if isinstance(e, train.WorkerGroupError):
            print(e.worker_failures)
            failure = e.worker_failures[0]
            assert isinstance(failure, RuntimeError) and str(failure) == "Simulated training error", failure
            print("WORKER GROUP ERROR OK")
