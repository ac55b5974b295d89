"""Ray Train 2.60's hyperparameter sweep: a TorchTrainer inside a Tune function trainable, ASHA stopping weak trials.

Written for Ray Train (``ray.train``, ``ray.tune.integration.ray_train.TuneReportCallback``); runs on
raytrain_nb after changing only the imports (``ray.train`` -> ``raytrain_nb``, ``ray.train.torch`` ->
``raytrain_nb.torch``, ``ray.tune.integration.ray_train`` -> ``raytrain_nb.tune``); ``ray.tune`` is unchanged.
Four trials (one per learning rate) of two workers each, at most two at once; each trial's training
run reports every epoch with a checkpoint, and ASHA stops the trials that fall behind.
"""
import os
import tempfile

import ray.train as train
import ray.train.torch as train_torch
import torch
from ray import tune
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer
from ray.tune.integration.ray_train import TuneReportCallback
from ray.tune.schedulers import ASHAScheduler
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

EPOCHS = 4


def make_dataset(n=256):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()
    return TensorDataset(x, y)


def train_func(config):
    """One trial's training loop, on each of its workers."""
    torch.manual_seed(0)
    model = train_torch.prepare_model(nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    loader = train_torch.prepare_data_loader(DataLoader(make_dataset(), batch_size=32, shuffle=True))
    loss_fn = nn.CrossEntropyLoss()
    for epoch in range(config["epochs"]):
        if train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        total, loss_sum = 0, 0.0
        for x, y in loader:
            loss = loss_fn(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(y)
            total += len(y)
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                torch.save(model.module.state_dict(), os.path.join(tmp, "model.pt"))
                checkpoint = Checkpoint.from_directory(tmp)
            train.report({"epoch": epoch, "loss": loss_sum / total}, checkpoint=checkpoint)


def driver_fn(config):
    """One trial: a distributed training run with this trial's hyperparameters, reporting to Tune."""
    trainer = TorchTrainer(
        train_func,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),  # a laptop runs two trials
        # Ray Train needs a unique name per trial (raytrain_nb names a trial's run by itself when none is given)
        run_config=RunConfig(name=f"train-{tune.get_context().get_trial_id()}", callbacks=[TuneReportCallback()]),
    )
    trainer.fit()


def main():
    tuner = tune.Tuner(
        # the trial's function only drives its workers, which reserve their own resources: give it little
        tune.with_resources(driver_fn, {"cpu": 0.1}),
        param_space={"lr": tune.grid_search([0.5, 0.2, 0.002, 0.001]), "epochs": EPOCHS},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            scheduler=ASHAScheduler(max_t=EPOCHS, grace_period=1, reduction_factor=2),
            max_concurrent_trials=2,
        ),
        run_config=tune.RunConfig(name=f"tune_torch-{os.getpid()}", storage_path=os.environ.get("TUNE_STORAGE_PATH")),
    )
    results = tuner.fit()
    best = results.get_best_result()
    print(f"best config: {best.config}, loss {best.metrics['loss']:.4f}")
    iterations = sorted(r.metrics["training_iteration"] for r in results)
    print(f"iterations per trial: {iterations}")
    # the best trial's newest committed checkpoint (raytrain_nb also gives it as best.checkpoint)
    with Checkpoint(best.metrics["checkpoint_path"]).as_directory() as checkpoint_dir:
        state = torch.load(os.path.join(checkpoint_dir, "model.pt"), weights_only=True)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    model.load_state_dict(state)
    return results


if __name__ == "__main__":
    main()
    print("TUNE OK")
