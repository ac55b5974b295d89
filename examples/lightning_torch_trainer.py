"""Ray Train's "Train a PyTorch Lightning model", on generated data: RayDDPStrategy, RayLightningEnvironment,
RayTrainReportCallback and prepare_trainer in a TorchTrainer; one worker crashes once and the run resumes
from the newest checkpoint (FailureConfig).

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports
(``ray.train`` -> ``raytrain_nb``, ``ray.train.lightning`` -> ``raytrain_nb.lightning``,
``ray.train.torch`` -> ``raytrain_nb.torch``).
"""
import os
import signal
import tempfile

import lightning.pytorch as pl
import ray.train as train
import torch
from ray.train import CheckpointConfig, FailureConfig, RunConfig, ScalingConfig
from ray.train.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer
from ray.train.torch import TorchTrainer
from torch import nn
from torch.utils.data import DataLoader, TensorDataset


def make_dataset(n=256):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(n, 8, generator=g)
    y = x[:, :4].sum(dim=1, keepdim=True) + 0.1 * torch.randn(n, 1, generator=g)
    return TensorDataset(x, y)


class Regressor(pl.LightningModule):
    def __init__(self, lr=0.05):
        super().__init__()
        self.lr = lr
        self.net = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))
        self.start_epoch = 0

    def on_train_start(self):
        self.start_epoch = self.current_epoch  # > 0 when fit resumed from a checkpoint

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss, on_epoch=True, on_step=False, sync_dist=True)
        self.log("start_epoch", float(self.start_epoch), on_epoch=True, on_step=False, sync_dist=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=0.9)


class CrashOnce(pl.Callback):
    """Simulates a lost worker: rank 1 dies once, right after the report of epoch ``epoch``."""

    def __init__(self, epoch, marker):
        self.epoch, self.marker = epoch, marker

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch == self.epoch and trainer.global_rank == 1 and not os.path.exists(self.marker):
            open(self.marker, "w").close()
            print("worker 1 crashes once, now")
            os.kill(os.getpid(), signal.SIGKILL)


def train_func(config):
    model = Regressor(lr=config["lr"])
    train_loader = DataLoader(make_dataset(), batch_size=config["batch_size"], shuffle=True)

    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        devices="auto",
        accelerator="auto",
        strategy=RayDDPStrategy(),
        plugins=[RayLightningEnvironment()],
        callbacks=[RayTrainReportCallback(), CrashOnce(config["crash_after_epoch"], config["crash_marker"])],
        enable_checkpointing=False,  # RayTrainReportCallback reports a checkpoint every epoch
        enable_progress_bar=False,
        enable_model_summary=False,
        logger=False,
    )
    trainer = prepare_trainer(trainer)

    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as ckpt_dir:
            ckpt_path = os.path.join(ckpt_dir, RayTrainReportCallback.CHECKPOINT_NAME)
            trainer.fit(model, train_dataloaders=train_loader, ckpt_path=ckpt_path)
    else:
        trainer.fit(model, train_dataloaders=train_loader)


if __name__ == "__main__":
    marker = os.path.join(tempfile.mkdtemp(), "crashed")
    trainer = TorchTrainer(
        train_func,
        train_loop_config={"lr": 0.05, "batch_size": 32, "epochs": 4, "crash_after_epoch": 1,
                           "crash_marker": marker},
        scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
        run_config=RunConfig(
            name=f"lightning-{os.getpid()}",
            checkpoint_config=CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="train_loss",
                                               checkpoint_score_order="min"),
            failure_config=FailureConfig(max_failures=1),
        ),
    )
    result = trainer.fit()
    print(f"final metrics: {result.metrics}")
    assert os.path.exists(marker) and result.metrics["epoch"] == 3
    assert result.metrics["start_epoch"] > 0  # resumed from a checkpoint (raytrain_nb: always the newest, epoch 1's)
    with result.checkpoint.as_directory() as ckpt_dir:
        model = Regressor.load_from_checkpoint(os.path.join(ckpt_dir, RayTrainReportCallback.CHECKPOINT_NAME))
    print(f"newest checkpoint: {result.checkpoint.path}")
    print("LIGHTNING OK")
