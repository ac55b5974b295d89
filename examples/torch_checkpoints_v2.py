"""Ray Train V2's report(): a checkpoint per epoch named by ``checkpoint_dir_name`` and uploaded in the background
(``CheckpointUploadMode.ASYNC``), a validation function that scores each checkpoint in a Ray task of its own
(``ValidationConfig``, ``report(validation=True)``), and ``get_all_reported_checkpoints()`` at the end of training.

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports
(``ray.train`` -> ``raytrain_nb``, ``ray.train.torch`` -> ``raytrain_nb.torch``).
"""
import os
import tempfile

import torch
from torch import nn

import ray.train as train
from ray.train import (Checkpoint, CheckpointConfig, CheckpointUploadMode, RunConfig, ScalingConfig,
                       ValidationConfig, ValidationTaskConfig)
from ray.train.torch import TorchTrainer, prepare_model

EPOCHS = 3


def batch(n, seed):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 4, generator=g)
    return x, x.sum(dim=1, keepdim=True)


def validate(checkpoint, n=256):
    """Runs apart from the training workers: the checkpoint's loss on held-out data."""
    model = nn.Linear(4, 1)
    with checkpoint.as_directory() as d:
        model.load_state_dict(torch.load(os.path.join(d, "model.pt"), weights_only=True))
    x, y = batch(n, seed=1234)
    with torch.no_grad():
        return {"val_loss": nn.functional.mse_loss(model(x), y).item()}


def train_func(config):
    torch.manual_seed(0)
    model = prepare_model(nn.Linear(4, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"])
    rank = train.get_context().get_world_rank()
    for epoch in range(EPOCHS):
        for step in range(20):
            x, y = batch(32, seed=epoch * 100 + step * 2 + rank)
            loss = nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        tmp = tempfile.mkdtemp()  # ASYNC deletes it once uploaded
        if rank == 0:
            torch.save(model.module.state_dict(), os.path.join(tmp, "model.pt"))
        train.report({"epoch": epoch, "loss": loss.item()}, checkpoint=Checkpoint.from_directory(tmp),
                     checkpoint_dir_name=f"epoch_{epoch}", checkpoint_upload_mode=CheckpointUploadMode.ASYNC,
                     validation=True)
    reported = train.get_all_reported_checkpoints()  # waits for the uploads and the validations
    if rank == 0:
        for rc in reported:
            print(os.path.basename(rc.checkpoint.path), rc.status.name, rc.metrics.get("val_loss"))
    return [(os.path.basename(rc.checkpoint.path), rc.status.name) for rc in reported]


if __name__ == "__main__":
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 0.05},
        scaling_config=ScalingConfig(num_workers=2),
        validation_config=ValidationConfig(validate, task_config=ValidationTaskConfig(fn_kwargs={"n": 512})),
        run_config=RunConfig(name="checkpoints-v2", checkpoint_config=CheckpointConfig(
            num_to_keep=2, checkpoint_score_attribute="val_loss", checkpoint_score_order="min")),
    )
    result = trainer.fit()
    best = sorted(((os.path.basename(c.path), m["val_loss"]) for c, m in result.best_checkpoints), key=lambda b: b[1])
    print("best checkpoints:", best)
    assert len(best) == 2 and best[0][1] <= best[1][1], best
    assert all(name.startswith("epoch_") for name, _ in best)
    print("CHECKPOINTS V2 OK")
