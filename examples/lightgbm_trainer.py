"""Ray Train's LightGBMTrainer docstring example, then FailureConfig(max_failures=1) with a worker killed
mid-training: the run restarts and resumes boosting from the newest checkpoint (generated data).

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports
(``ray.train`` -> ``raytrain_nb``, ``ray.train.lightgbm`` -> ``raytrain_nb.lightgbm``). The docstring's
``ray.train.<name>`` is spelled ``train.<name>`` here (``import ray.train as train``), and
``ray.train.lightgbm.get_network_params`` is imported by name: the only changes.
"""
import os
import signal
import tempfile

import lightgbm as lgb
import numpy as np
import ray.data
import ray.train as train
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.lightgbm import (LightGBMTrainer, RayTrainReportCallback, get_network_params,
                                normalize_pandas_for_lightgbm)


def train_fn_per_worker(config: dict):
    # (Optional) Add logic to resume training state from a checkpoint.
    # train.get_checkpoint()

    # 1. Get the dataset shard for the worker and convert to a `lgb.Dataset`
    train_ds_iter, eval_ds_iter = (
        train.get_dataset_shard("train"),
        train.get_dataset_shard("validation"),
    )
    train_ds, eval_ds = train_ds_iter.materialize(), eval_ds_iter.materialize()
    train_df = normalize_pandas_for_lightgbm(train_ds.to_pandas())
    eval_df = normalize_pandas_for_lightgbm(eval_ds.to_pandas())
    train_X, train_y = train_df.drop("y", axis=1), train_df["y"]
    eval_X, eval_y = eval_df.drop("y", axis=1), eval_df["y"]

    train_set = lgb.Dataset(train_X, label=train_y)
    eval_set = lgb.Dataset(eval_X, label=eval_y)

    # 2. Run distributed data-parallel training.
    # `get_network_params` sets up the necessary configurations for LightGBM
    # to set up the data parallel training worker group on your Ray cluster.
    params = {
        "objective": "regression",
        # Adding the lines below are the only changes needed
        # for your `lgb.train` call!
        "tree_learner": "data_parallel",
        "pre_partition": True,
        **get_network_params(),
    }
    lgb.train(
        params,
        train_set,
        valid_sets=[eval_set],
        valid_names=["eval"],
        num_boost_round=1,
        # To access the checkpoint from trainer, you need this callback.
        callbacks=[RayTrainReportCallback()],
    )


def crash_once(at, marker):
    """Rank 1 is SIGKILLed once, after boosting round ``at`` (a marker file says it happened)."""

    def callback(env):
        if env.iteration == at and train.get_context().get_world_rank() == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            print("worker 1 crashes once, now", flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    return callback


def resumable_train_fn(config):
    rank = train.get_context().get_world_rank()
    rng = np.random.default_rng(rank)
    x = rng.normal(size=(200, 4))
    train_set = lgb.Dataset(x, label=x @ np.array([1.0, -2.0, 0.5, 3.0]))
    booster, start = None, 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        booster = RayTrainReportCallback.get_model(checkpoint)
        start = booster.current_iteration()
    params = {"objective": "regression", "tree_learner": "data_parallel", "pre_partition": True,
              "num_threads": 1, "verbose": -1, "min_data_in_leaf": 5, **get_network_params()}
    lgb.train(
        params,
        train_set,
        valid_sets=[train_set],
        valid_names=["train"],
        num_boost_round=config["rounds"] - start,
        init_model=booster,
        callbacks=[
            RayTrainReportCallback(frequency=1, results_postprocessing_fn=lambda m: {**m, "start_round": start}),
            crash_once(config["crash_after"], config["marker"]),
        ],
    )


if __name__ == "__main__":
    train_ds = ray.data.from_items([{"x": x, "y": x + 1} for x in range(32)])
    eval_ds = ray.data.from_items(
        [{"x": x, "y": x + 1} for x in range(32, 32 + 16)]
    )
    trainer = LightGBMTrainer(
        train_fn_per_worker,
        datasets={"train": train_ds, "validation": eval_ds},
        scaling_config=ScalingConfig(num_workers=2),
    )
    result = trainer.fit()
    booster = RayTrainReportCallback.get_model(result.checkpoint)
    assert booster.current_iteration() == 1, booster.current_iteration()
    print("docstring example metrics:", result.metrics)

    with tempfile.TemporaryDirectory() as tmp:
        trainer = LightGBMTrainer(
            resumable_train_fn,
            train_loop_config={"rounds": 6, "crash_after": 3, "marker": os.path.join(tmp, "crashed")},
            scaling_config=ScalingConfig(num_workers=2),
            run_config=RunConfig(failure_config=FailureConfig(max_failures=1)),
        )
        result = trainer.fit()
        assert os.path.exists(os.path.join(tmp, "crashed"))
    booster = RayTrainReportCallback.get_model(result.checkpoint)
    print("final metrics:", result.metrics)
    assert booster.current_iteration() == 6, booster.current_iteration()
    # the crash came after round 3's checkpoint (4 rounds): the second attempt boosted the last two only
    assert result.metrics["start_round"] == 4, result.metrics
    print("LIGHTGBM OK")
