"""The trials of the Tune tests: Ray Train 2.60's pattern (a TorchTrainer inside a function trainable) on raytrain_nb.

Pickled by value (the tests register this module), so trial actors and workers need not import tests/.
Rank 0 also reports its placement group, so a test can follow each trial's resources in Ray's tables.
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Any, Dict

import torch
from torch import nn

import raytrain_nb as train
from raytrain_nb import Checkpoint, RunConfig, ScalingConfig
from raytrain_nb.torch import TorchTrainer, prepare_model
from raytrain_nb.tune import TuneReportCallback

EPOCHS = 4


def train_func(config: Dict[str, Any]) -> None:
    """A tiny regression, one report (with a checkpoint from rank 0) per epoch."""
    import ray  # ray: the worker's placement group, for the test's checks

    torch.manual_seed(0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(64, 4, generator=g)
    y = x.sum(dim=1, keepdim=True)
    model = prepare_model(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    ctx = train.get_context()
    start = train.get_checkpoint()
    first = 0
    if start is not None:
        with start.as_directory() as d:
            first = torch.load(os.path.join(d, "state.pt"), weights_only=True)["epoch"] + 1
    for epoch in range(first, config.get("epochs", EPOCHS)):
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(config.get("sleep", 0.0))
        metrics = {"epoch": epoch, "loss": float(loss), "pg": ray.get_runtime_context().get_placement_group_id()}
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if ctx.get_world_rank() == 0:
                torch.save({"epoch": epoch, "model": model.module.state_dict()}, os.path.join(tmp, "state.pt"))
                checkpoint = Checkpoint.from_directory(tmp)
            train.report(metrics, checkpoint=checkpoint)


def driver_fn(config: Dict[str, Any]) -> None:
    """One trial: a 2-worker run with this trial's config, reporting to Tune (no run name: the trial names it)."""
    TorchTrainer(train_func, train_loop_config=config, scaling_config=ScalingConfig(num_workers=2),
                 run_config=RunConfig(callbacks=[TuneReportCallback()])).fit()


SWEEP_SCRIPT = """
import os, sys, time
sys.path.insert(0, {root!r})
from ray import tune
from ray.tune.schedulers import FIFOScheduler
import ray
from tests.integration import tune_trials
ray.cloudpickle.register_pickle_by_value(tune_trials)

class Announce(tune.Callback):
    def on_trial_result(self, iteration, trials, trial, result, **info):
        print("RESULT", trial.trial_id, flush=True)

tuner = tune.Tuner(tune.with_resources(tune_trials.driver_fn, {{"cpu": 0.1}}),
                   param_space={{"lr": tune.grid_search([0.1, 0.05, 0.02, 0.01]), "epochs": 1000, "sleep": 0.2}},
                   tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2),
                   run_config=tune.RunConfig(name="ctrl-c", storage_path={storage!r}, verbose=0,
                                             callbacks=[Announce()]))
try:
    tuner.fit()
finally:
    print("SWEEP ENDED", flush=True)
    time.sleep(120)  # the driver (Ray's job) lives on: what is gone was stopped by the sweep, not by the job's end
"""


def sweep_script(storage: str) -> str:
    """The Ctrl-C test's driver: an endless sweep of two concurrent trials, announcing each result."""
    return SWEEP_SCRIPT.format(root=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                               storage=storage)
