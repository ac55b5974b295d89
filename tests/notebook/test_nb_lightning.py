"""Lightning ``Trainer.fit`` in ``%%distributed`` cells of a real kernel, on one warm group.

Fit a LightningModule with ``RayDDPStrategy`` on 2 workers (its metrics and checkpoint reach the driver),
snapshot, fit on, roll back (weights and the trainer's optimizer equal the snapshot), ``%dist_rescale 1`` and
fit with a new ``Trainer``: it starts from the warm module and the rolled-back optimizer state, at the new size;
``%dist_rescale 2`` and fit again: the rank that joined starts from the same state as its peer, and both end
equal.
"""
from __future__ import annotations

import pytest

from .nbkernel import START_TIMEOUT_S

pytest.importorskip("lightning")
pytestmark = pytest.mark.notebook

SETUP = """%%distributed --workers 2
import hashlib
import torch, lightning.pytorch as pl
from raytrain_nb.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    def training_step(self, batch, i):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("loss", loss, on_epoch=True, on_step=False, sync_dist=True)
        return loss
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

def digest(module, optimizer):
    tensors = [*module.parameters(), *(s["momentum_buffer"] for s in optimizer.state.values())]
    return hashlib.sha1(b"".join(t.detach().contiguous().numpy().tobytes() for t in tensors)).hexdigest()

class AtStart(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        global started
        started = digest(pl_module, trainer.optimizers[0]), trainer.world_size, trainer.num_training_batches

def make_trainer():
    return prepare_trainer(pl.Trainer(max_epochs=1, strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
                                      callbacks=[RayTrainReportCallback(), AtStart()], accelerator="cpu",
                                      devices="auto", logger=False, enable_progress_bar=False,
                                      enable_model_summary=False, enable_checkpointing=False))

g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(128, 8, generator=g), torch.randn(128, 1, generator=g))
loader = torch.utils.data.DataLoader(data, batch_size=16)
torch.manual_seed(0)
model = Net()
trainer = make_trainer()
trainer.fit(model, train_dataloaders=loader)
"""

FIT = "%%distributed\ntrainer = make_trainer()\ntrainer.fit(model, train_dataloaders=loader)"


def _digests(kernel):
    kernel.ok("%%distributed\n_h = digest(model, trainer.optimizers[0])")
    return eval(kernel.ok("_g.pull('_h', rank=None)").value)


def test_fit_in_cells_snapshot_rollback_rescale_and_a_warm_second_fit(kernel):
    kernel.ok("import raytrain_nb as _rt\n_old = _rt.active_group()\nif _old is not None:\n    _old.shutdown()")
    kernel.ok(SETUP, timeout=START_TIMEOUT_S)
    kernel.ok("_g = _rt.active_group()\n_ck = _g.checkpoints('reported')")
    # RayTrainReportCallback: the epoch's metrics and Lightning's checkpoint reached the run
    assert kernel.ok("_ck[-1].metrics['step'], _ck[-1].metrics['epoch'], 'loss' in _ck[-1].metrics").value \
        == "(4, 0, True)"
    assert "checkpoint.ckpt" in kernel.ok("import os\nos.listdir(_ck[-1].checkpoint.path)").value
    # the fit ran at world size 2 on the group's process group: each rank had half the 8 batches
    assert eval(kernel.ok("_g.pull('started', rank=None)").value)[0][1:] == (2, 4)

    snap = _digests(kernel)
    assert snap[0] == snap[1]
    kernel.ok("%dist_checkpoint --name before")
    kernel.ok(FIT)
    moved = _digests(kernel)
    assert moved[0] == moved[1] != snap[0]
    kernel.ok("%dist_rollback before")
    assert _digests(kernel) == snap  # the module and the optimizer its trainer made, in place

    kernel.ok("%dist_rescale 1", timeout=START_TIMEOUT_S)
    kernel.ok(FIT)
    # a new Trainer fits the warm module with the rolled-back optimizer state, at world size 1: all 8 batches
    assert eval(kernel.ok("_g.pull('started', rank=None)").value) == [(snap[0], 1, 8)]
    alone = _digests(kernel)
    kernel.ok("%dist_rescale 2", timeout=START_TIMEOUT_S)
    kernel.ok(FIT)
    # rank 1 joined in the rescale: it starts from the same module and optimizer state as rank 0
    assert eval(kernel.ok("_g.pull('started', rank=None)").value) == [(alone[0], 2, 4)] * 2
    after = _digests(kernel)
    assert after[0] == after[1] != alone[0]
    kernel.ok("%dist_shutdown")
