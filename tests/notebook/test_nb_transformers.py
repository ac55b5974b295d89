"""A Transformers ``Trainer`` and Accelerate in ``%%distributed`` cells of a real kernel, on one warm group.

Train a tiny BERT with ``RayTrainReportCallback`` (its metrics and checkpoint reach the driver), prepare a model,
optimizer and data loader with Accelerate and train them, snapshot, train both on, roll back (both equal the
snapshot again), ``%dist_rescale 1``: the old ``Accelerator``, a new one and the ``Trainer`` made before the
rescale all see one process, and both train on at the new size.
"""
from __future__ import annotations

import pytest

from .nbkernel import START_TIMEOUT_S

pytest.importorskip("transformers")
pytestmark = pytest.mark.notebook

SETUP = """%%distributed --workers 2
import hashlib
import torch
from accelerate import Accelerator
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments
from raytrain_nb.huggingface.transformers import RayTrainReportCallback, prepare_trainer

class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        self.ids = torch.randint(0, 100, (n, 16), generator=torch.Generator().manual_seed(1))
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i, 0] % 2}

torch.manual_seed(0)
model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
    num_attention_heads=2, intermediate_size=64, max_position_embeddings=16))
args = TrainingArguments(output_dir="hf", per_device_train_batch_size=8, max_steps=4, logging_steps=2,
                         save_steps=4, learning_rate=1e-3, report_to="none", disable_tqdm=True,
                         dataloader_pin_memory=False)
trainer = prepare_trainer(Trainer(model=model, args=args, train_dataset=Tokens(64),
                                  callbacks=[RayTrainReportCallback()]))
trainer.train()
"""

ACCELERATE = """%%distributed
accelerator = Accelerator()
torch.manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randn(32, 1))
net = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
net, opt, loader = accelerator.prepare(net, opt, torch.utils.data.DataLoader(data, batch_size=4))

def epoch():
    for x, y in loader:
        loss = (net(x) - y).pow(2).mean()
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
    return len(loader)

_n = epoch()
"""

#: Each rank's Trainer model, Trainer optimizer state, Accelerate model and optimizer state, as one digest.
DIGEST = """%%distributed
_t = [*trainer.model.parameters(), *(v for s in trainer.optimizer.state.values() for v in s.values()
      if torch.is_tensor(v)), *net.parameters(), *(s['momentum_buffer'] for s in opt.state.values())]
_h = hashlib.sha1(b"".join(t.detach().contiguous().numpy().tobytes() for t in _t)).hexdigest()
"""


def _digests(kernel):
    kernel.ok(DIGEST)
    return eval(kernel.ok("_g.pull('_h', rank=None)").value)


def test_trainer_and_accelerate_in_cells_snapshot_rollback_and_rescale(kernel):
    kernel.ok("import raytrain_nb as _rt\n_old = _rt.active_group()\nif _old is not None:\n    _old.shutdown()")
    kernel.ok(SETUP, timeout=START_TIMEOUT_S)
    kernel.ok("_g = _rt.active_group()\n_ck = _g.checkpoints('reported')")
    assert kernel.ok("_ck[-1].metrics['step'], 'loss' in _ck[-1].metrics").value == "(4, True)"
    files = kernel.ok("import os\nsorted(os.listdir(os.path.join(_ck[-1].checkpoint.path, 'checkpoint')))").value
    assert "model.safetensors" in files and "rng_state_1.pth" in files, files

    kernel.ok(ACCELERATE)
    # each rank trained on its half of the batches, and DDP kept the two copies equal
    assert eval(kernel.ok("_g.pull('_n', rank=None)").value) == [4, 4]
    snap = _digests(kernel)
    assert snap[0] == snap[1]
    kernel.ok("%dist_checkpoint --name before")

    kernel.ok("%%distributed\ntrainer.train()\n_n = epoch()")
    moved = _digests(kernel)
    assert moved[0] == moved[1] != snap[0]
    kernel.ok("%dist_rollback before")
    assert _digests(kernel) == snap

    kernel.ok("%dist_rescale 1", timeout=START_TIMEOUT_S)
    kernel.ok("%%distributed\n_sizes = (accelerator.num_processes, Accelerator().num_processes, trainer.args.world_size)")
    assert kernel.ok("_g.pull('_sizes', rank=0)").value == "(1, 1, 1)"
    kernel.ok("%%distributed\ntrainer.train()\n_steps = trainer.state.global_step\n"
              "loader = accelerator.prepare(torch.utils.data.DataLoader(data, batch_size=4))\n_n = epoch()\n"
              "_new = TrainingArguments(output_dir='hf2', report_to='none').world_size")
    assert kernel.ok("_g.pull('_steps', rank=0), _g.pull('_n', rank=0), _g.pull('_new', rank=0)").value == "(4, 8, 1)"
    kernel.ok("%dist_shutdown")
