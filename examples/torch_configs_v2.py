"""Ray Train V2's configuration written as Ray's docs write it: positional configs, a process group timeout, a
runtime environment for the workers, the logging level, ``prepare_data_loader(data_loader=...)``,
``prepare_model(move_to_device=<device>)``, an explicitly synchronous checkpoint upload and ``TorchCheckpoint``.

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports
(``ray.train`` -> ``raytrain_nb``, ``ray.train.torch`` -> ``raytrain_nb.torch``).
"""
import os

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ray import train
from ray.train import (CheckpointConfig, CheckpointUploadMode, FailureConfig, LoggingConfig, RunConfig,
                       ScalingConfig)
from ray.train.torch import TorchCheckpoint, TorchConfig, TorchTrainer, get_device, prepare_data_loader, prepare_model


def train_func(config):
    # The runtime environment reached every worker.
    assert os.environ["EXAMPLE_RUNTIME_ENV"] == "on", "worker_runtime_env did not reach the workers"
    ctx = train.get_context()
    g = torch.Generator().manual_seed(0)
    data = TensorDataset(torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g))
    loader = prepare_data_loader(data_loader=DataLoader(data, batch_size=32, shuffle=True), auto_transfer=True)
    model = prepare_model(nn.Linear(4, 1), move_to_device=get_device())
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    for epoch in range(config["epochs"]):
        if ctx.get_world_size() > 1:
            loader.sampler.set_epoch(epoch)
        for x, y in loader:
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        checkpoint = None
        if ctx.get_world_rank() == 0:
            checkpoint = TorchCheckpoint.from_state_dict(model.state_dict())  # DDP's "module." prefix dropped
        train.report({"epoch": epoch, "loss": loss.item()}, checkpoint=checkpoint,
                     checkpoint_upload_mode=CheckpointUploadMode.SYNC, delete_local_checkpoint_after_upload=True)
    return {"epochs": config["epochs"], "world_size": ctx.get_world_size()}


if __name__ == "__main__":
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 0.05, "epochs": 3},
        torch_config=TorchConfig("gloo", timeout_s=300),
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(
            "torch-configs-v2",
            failure_config=FailureConfig(1),
            checkpoint_config=CheckpointConfig(2, "loss", "min"),
            worker_runtime_env={"env_vars": {"EXAMPLE_RUNTIME_ENV": "on"}},
            logging_config=LoggingConfig("WARNING"),
        ),
    )
    result = trainer.fit()
    model = TorchCheckpoint.from_directory(result.checkpoint.path).get_model(nn.Linear(4, 1))
    assert result.return_value == {"epochs": 3, "world_size": 2}, result.return_value
    assert len(result.best_checkpoints) == 2, result.best_checkpoints
    print("weights:", [round(w, 3) for w in model.weight.flatten().tolist()])
    print("CONFIGS V2 OK")
