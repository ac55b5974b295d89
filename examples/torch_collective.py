"""Rank 0 prepares the dataset while the other workers wait at ``collective.barrier()``, then computes the feature
statistics once and sends them to every worker with ``collective.broadcast_from_rank_zero`` (Ray Train V2's
``ray.train.collective``; generated data).

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports
(``ray.train`` -> ``raytrain_nb``, ``ray.train.collective`` -> ``raytrain_nb.collective``,
``ray.train.torch`` -> ``raytrain_nb.torch``).
"""
import os
import tempfile

import torch
from torch import nn

import ray.train as train
import ray.train.torch as train_torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.collective import barrier, broadcast_from_rank_zero
from ray.train.torch import TorchTrainer


def prepare_dataset(data_dir):
    """What one worker should do alone: download and preprocess the dataset (here: generate it), written atomically."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(512, 8, generator=g) * 3 + 1
    y = x[:, :4].sum(dim=1, keepdim=True)
    path = os.path.join(data_dir, "train.pt")
    torch.save({"x": x, "y": y}, path + ".partial")
    os.replace(path + ".partial", path)


def train_func(config):
    context = train.get_context()
    rank, world_size = context.get_world_rank(), context.get_world_size()
    data_dir = config["data_dir"]  # a directory every worker reads (shared storage on a cluster)

    if rank == 0:
        prepare_dataset(data_dir)
    barrier()  # the other workers wait here until rank 0 has written the dataset
    data = torch.load(os.path.join(data_dir, "train.pt"), weights_only=True)

    # Rank 0 computes the normalisation once; every worker gets the same numbers (small data: 16 floats).
    stats = None
    if rank == 0:
        stats = {"mean": data["x"].mean(dim=0).tolist(), "std": data["x"].std(dim=0).tolist(), "by": rank}
    stats = broadcast_from_rank_zero(stats)
    assert stats["by"] == 0, stats
    x = (data["x"][rank::world_size] - torch.tensor(stats["mean"])) / torch.tensor(stats["std"])
    y = data["y"][rank::world_size]

    model = train_torch.prepare_model(nn.Linear(8, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(config["epochs"]):
        loss = (model(x) - y).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        metrics = {"epoch": epoch, "loss": loss.item(), "mean0": stats["mean"][0]}
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:  # the model and the statistics it needs, saved once
                torch.save({"model": model.module.state_dict(), "stats": stats}, os.path.join(tmp, "model.pt"))
                checkpoint = Checkpoint.from_directory(tmp)
            train.report(metrics, checkpoint=checkpoint)


if __name__ == "__main__":
    with tempfile.TemporaryDirectory() as data_dir:
        trainer = TorchTrainer(
            train_func,
            train_loop_config={"data_dir": data_dir, "epochs": 3},
            scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
            run_config=RunConfig(name=f"collective-{os.getpid()}"),
        )
        result = trainer.fit()
        expected = torch.load(os.path.join(data_dir, "train.pt"), weights_only=True)["x"].mean(dim=0)[0].item()
    print(f"metrics of the last checkpoint: {result.metrics}")
    assert result.metrics["epoch"] == 2 and abs(result.metrics["mean0"] - expected) < 1e-6
    with result.checkpoint.as_directory() as checkpoint_dir:
        saved = torch.load(os.path.join(checkpoint_dir, "model.pt"), weights_only=True)
    assert saved["stats"]["by"] == 0 and abs(saved["stats"]["mean"][0] - expected) < 1e-6
    print("COLLECTIVE OK")
