"""Ray Train's XGBoostTrainer docstring example, then FailureConfig(max_failures=1) with a worker killed
mid-training: the run restarts and resumes boosting from the newest checkpoint (generated data).

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports
(``ray.train`` -> ``raytrain_nb``, ``ray.train.xgboost`` -> ``raytrain_nb.xgboost``). The docstring's
``ray.train.<name>`` is spelled ``train.<name>`` here (``import ray.train as train``), which is the only change.
"""
import os
import signal
import tempfile

import numpy as np
import ray.data
import ray.train as train
import xgboost
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.xgboost import RayTrainReportCallback, XGBoostTrainer


def train_fn_per_worker(config: dict):
    # (Optional) Add logic to resume training state from a checkpoint.
    # train.get_checkpoint()

    # 1. Get the dataset shard for the worker and convert to a `xgboost.DMatrix`
    train_ds_iter, eval_ds_iter = (
        train.get_dataset_shard("train"),
        train.get_dataset_shard("validation"),
    )
    train_ds, eval_ds = train_ds_iter.materialize(), eval_ds_iter.materialize()

    train_df, eval_df = train_ds.to_pandas(), eval_ds.to_pandas()
    train_X, train_y = train_df.drop("y", axis=1), train_df["y"]
    eval_X, eval_y = eval_df.drop("y", axis=1), eval_df["y"]

    dtrain = xgboost.DMatrix(train_X, label=train_y)
    deval = xgboost.DMatrix(eval_X, label=eval_y)

    params = {
        "tree_method": "approx",
        "objective": "reg:squarederror",
        "eta": 1e-4,
        "subsample": 0.5,
        "max_depth": 2,
    }

    # 2. Do distributed data-parallel training.
    # Ray Train sets up the necessary coordinator processes and
    # environment variables for your workers to communicate with each other.
    bst = xgboost.train(
        params,
        dtrain=dtrain,
        evals=[(deval, "validation")],
        num_boost_round=1,
        callbacks=[RayTrainReportCallback()],
    )


class CrashOnce(xgboost.callback.TrainingCallback):
    """Rank 1 is SIGKILLed once, after boosting round ``at`` (a marker file says it happened)."""

    def __init__(self, at, marker):
        super().__init__()
        self.at, self.marker = at, marker

    def after_iteration(self, model, epoch, evals_log):
        if epoch == self.at and train.get_context().get_world_rank() == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            print("worker 1 crashes once, now", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        return False


def resumable_train_fn(config):
    rank = train.get_context().get_world_rank()
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(200, 4))
    dtrain = xgboost.DMatrix(x, label=x @ np.array([1.0, -2.0, 0.5, 3.0]))
    booster, start = None, 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        booster = RayTrainReportCallback.get_model(checkpoint)
        start = booster.num_boosted_rounds()
    xgboost.train(
        {"tree_method": "hist", "max_depth": 3, "eta": 0.3},
        dtrain,
        evals=[(dtrain, "train")],
        num_boost_round=config["rounds"] - start,
        xgb_model=booster,
        callbacks=[
            RayTrainReportCallback(frequency=1, results_postprocessing_fn=lambda m: {**m, "start_round": start}),
            CrashOnce(config["crash_after"], config["marker"]),
        ],
    )


if __name__ == "__main__":
    train_ds = ray.data.from_items([{"x": x, "y": x + 1} for x in range(32)])
    eval_ds = ray.data.from_items([{"x": x, "y": x + 1} for x in range(16)])
    trainer = XGBoostTrainer(
        train_fn_per_worker,
        datasets={"train": train_ds, "validation": eval_ds},
        scaling_config=ScalingConfig(num_workers=2),
    )
    result = trainer.fit()
    booster = RayTrainReportCallback.get_model(result.checkpoint)
    assert booster.num_boosted_rounds() == 1, booster.num_boosted_rounds()
    print("docstring example metrics:", result.metrics)

    with tempfile.TemporaryDirectory() as tmp:
        trainer = XGBoostTrainer(
            resumable_train_fn,
            train_loop_config={"rounds": 6, "crash_after": 3, "marker": os.path.join(tmp, "crashed")},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(failure_config=FailureConfig(max_failures=1)),
        )
        result = trainer.fit()
        assert os.path.exists(os.path.join(tmp, "crashed"))
    booster = RayTrainReportCallback.get_model(result.checkpoint)
    print("final metrics:", result.metrics)
    assert booster.num_boosted_rounds() == 6, booster.num_boosted_rounds()
    # the crash came after round 3's checkpoint (4 rounds): the second attempt boosted the last two only
    assert result.metrics["start_round"] == 4, result.metrics
    print("XGBOOST OK")
