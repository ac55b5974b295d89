"""Ray Train with Ray Data: ``datasets=`` on the trainer, ``get_dataset_shard`` in the loop (generated data).

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports.
"""
import os
import tempfile

import numpy as np
import torch
from torch import nn

import ray
import ray.train as train
import ray.train.torch as train_torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def make_items(n=400):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0], dtype="float32")).reshape(-1, 1)
    return [{"x": x[i], "y": y[i]} for i in range(n)]


def train_func(config):
    model = train_torch.prepare_model(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    shard = train.get_dataset_shard("train")
    for epoch in range(config["epochs"]):
        rows, loss_sum = 0, 0.0
        for batch in shard.iter_torch_batches(batch_size=32, dtypes=torch.float32):
            loss = nn.functional.mse_loss(model(batch["x"]), batch["y"])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            rows += len(batch["x"])
            loss_sum += loss.item() * len(batch["x"])
        metrics = {"epoch": epoch, "loss": loss_sum / rows, "rows": rows}
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                torch.save(model.module.state_dict(), os.path.join(tmp, "model.pt"))
                checkpoint = Checkpoint.from_directory(tmp)
            train.report(metrics, checkpoint=checkpoint)


if __name__ == "__main__":
    train_ds = ray.data.from_items(make_items())
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 0.05, "epochs": 4},
        scaling_config=ScalingConfig(num_workers=2),
        datasets={"train": train_ds},
        run_config=RunConfig(name=f"data-{os.getpid()}"),
    )
    result = trainer.fit()
    print(f"final metrics: {result.metrics}")
    assert result.metrics["rows"] == 200  # each worker read half of the 400 rows
    assert result.metrics["loss"] < result.metrics_dataframe["loss"].iloc[0]
    print("DATA OK")
