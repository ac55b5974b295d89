"""Ray Train V2's local mode (``ScalingConfig(num_workers=0)``): the training function runs in this process, for
debugging with an ordinary debugger; the examples of Ray's local-mode guide (single process, Ray Data, a unit
test), with generated data.

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports. The guide's
``ray.train.<name>`` is spelled ``train.<name>`` here (``import ray.train as train``), its ``read_csv("s3://...")``
is ``from_items``, and its unit test is called directly rather than through ``unittest.main()``.
"""
import os
import tempfile
import unittest

import torch
from torch import nn

import ray
import ray.train as train
from ray.train import Checkpoint, ScalingConfig
from ray.train.torch import TorchTrainer


# Single-process local mode with PyTorch
def train_func(config):
    model = nn.Linear(10, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])

    for epoch in range(config["epochs"]):
        # Training loop
        loss = model(torch.randn(32, 10)).sum()
        loss.backward()
        optimizer.step()

        # Report metrics
        train.report({"loss": loss.item()})


# Using local mode with Ray Data
def data_train_func(config):
    # Get the dataset shard
    train_dataset = train.get_dataset_shard("train")

    rows = 0
    # Iterate over batches
    for batch in train_dataset.iter_batches(batch_size=32):
        # Training logic
        rows += len(batch["x"])
    return rows


# Testing with local mode
class TestTraining(unittest.TestCase):
    def test_training_runs(self):
        def train_func(config):
            # Minimal training logic
            train.report({"loss": 0.5})

        trainer = TorchTrainer(
            train_loop_per_worker=train_func,
            scaling_config=ScalingConfig(num_workers=0),
        )
        result = trainer.fit()

        self.assertIsNone(result.error)
        self.assertEqual(result.metrics["loss"], 0.5)


# The last checkpoint and the function's return value, as the results guide reads them
def checkpoint_train_func(config):
    for epoch in range(config["epochs"]):
        with tempfile.TemporaryDirectory() as temp_dir:
            torch.save({"epoch": epoch}, os.path.join(temp_dir, "model.pt"))
            train.report({"epoch": epoch}, checkpoint=Checkpoint.from_directory(temp_dir))
    return {"world_size": train.get_context().get_world_size()}


if __name__ == "__main__":
    trainer = TorchTrainer(
        train_loop_per_worker=train_func,
        train_loop_config={"lr": 0.01, "epochs": 3},
        scaling_config=ScalingConfig(num_workers=0),
    )
    result = trainer.fit()
    print(f"Final loss: {result.metrics['loss']}")
    assert result.path is None and result.error is None  # no run directory in local mode

    dataset = ray.data.from_items([{"x": float(i)} for i in range(100)])
    trainer = TorchTrainer(
        train_loop_per_worker=data_train_func,
        scaling_config=ScalingConfig(num_workers=0),
        datasets={"train": dataset},
    )
    result = trainer.fit()
    assert result.return_value == 100, result.return_value

    TestTraining("test_training_runs").test_training_runs()

    result = TorchTrainer(checkpoint_train_func, train_loop_config={"epochs": 2},
                          scaling_config=ScalingConfig(num_workers=0)).fit()
    assert result.metrics == {"epoch": 1} and result.checkpoint is not None, result
    assert result.return_value == {"world_size": 1}, result.return_value
    print("LOCAL MODE OK")
