"""Ray Train fault tolerance: FailureConfig restarts the run after a worker crashes once, and the loop
resumes from the newest checkpoint (generated data).

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports.
"""
import os
import signal
import tempfile

import torch
from torch import nn

import ray.train as train
import ray.train.torch as train_torch
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.torch import TorchTrainer


def train_func(config):
    model = nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    start_epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            state = torch.load(os.path.join(checkpoint_dir, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start_epoch = state["epoch"] + 1
    model = train_torch.prepare_model(model)
    rank = train.get_context().get_world_rank()

    for epoch in range(start_epoch, config["epochs"]):
        g = torch.Generator().manual_seed(epoch * 10 + rank)
        x = torch.randn(64, 4, generator=g)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:
                torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                            "epoch": epoch}, os.path.join(tmp, "state.pt"))
                checkpoint = Checkpoint.from_directory(tmp)
            train.report({"epoch": epoch, "loss": loss.item(), "start_epoch": start_epoch}, checkpoint=checkpoint)
        if epoch == 2 and rank == 1 and not os.path.exists(config["crash_marker"]):
            open(config["crash_marker"], "w").close()
            print("worker 1 crashes once, now")
            os.kill(os.getpid(), signal.SIGKILL)


if __name__ == "__main__":
    marker = os.path.join(tempfile.mkdtemp(), "crashed")
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"epochs": 6, "crash_marker": marker},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name=f"fault-tolerance-{os.getpid()}", failure_config=FailureConfig(max_failures=1)),
    )
    result = trainer.fit()
    print(f"final metrics: {result.metrics}")
    assert os.path.exists(marker) and result.metrics["epoch"] == 5
    assert result.metrics["start_epoch"] > 0  # resumed from a checkpoint (raytrain_nb: always the newest, epoch 2)
    print("FAULT TOLERANCE OK")
