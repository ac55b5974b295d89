"""Ray Train's PyTorch quickstart, on generated data: prepare_model, prepare_data_loader, a checkpoint each epoch.

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports
(``ray.train`` -> ``raytrain_nb``, ``ray.train.torch`` -> ``raytrain_nb.torch``).
"""
import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import ray.train as train
import ray.train.torch as train_torch
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def make_dataset(n=512):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = (x[:, :4].sum(dim=1) > 0).long()  # two classes
    return TensorDataset(x, y)


def train_func(config):
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    model = train_torch.prepare_model(model)
    loss_fn = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])

    loader = DataLoader(make_dataset(), batch_size=config["batch_size"], shuffle=True)
    loader = train_torch.prepare_data_loader(loader)

    for epoch in range(config["epochs"]):
        if train.get_context().get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        model.train()
        total, correct, loss_sum = 0, 0, 0.0
        for x, y in loader:
            logits = model(x)
            loss = loss_fn(logits, y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            loss_sum += loss.item() * len(y)
            correct += (logits.argmax(dim=1) == y).sum().item()
            total += len(y)
        metrics = {"epoch": epoch, "loss": loss_sum / total, "accuracy": correct / total}
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if train.get_context().get_world_rank() == 0:
                torch.save(model.module.state_dict(), os.path.join(tmp, "model.pt"))
                checkpoint = Checkpoint.from_directory(tmp)
            train.report(metrics, checkpoint=checkpoint)
        if train.get_context().get_world_rank() == 0:
            print(metrics)


if __name__ == "__main__":
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 0.1, "batch_size": 32, "epochs": 3},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(name=f"quickstart-{os.getpid()}"),
    )
    result = trainer.fit()
    print(f"final metrics: {result.metrics}")
    with result.checkpoint.as_directory() as checkpoint_dir:
        state = torch.load(os.path.join(checkpoint_dir, "model.pt"), weights_only=True)
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 2))
    model.load_state_dict(state)
    assert result.metrics["epoch"] == 2 and len(result.metrics_dataframe) == 3
    print("QUICKSTART OK")
