"""The trial of the warm sweep tests (pickled by value, so Tune's and the trainer's workers need not import tests/).

A trial fine-tunes the group's model (``tests/groups.py`` ``SETUP``: ``model``, ``opt``) from the warm checkpoint at
its own learning rate, through our ``TorchTrainer``, and reports each step's loss with a checkpoint saved by name
(to Tune through ``TuneReportCallback``).
"""
from __future__ import annotations

import hashlib
import tempfile
from typing import Any, Dict, List

import torch

import raytrain_nb as train
from raytrain_nb.torch import TorchTrainer, prepare_model
from raytrain_nb.tune import TuneReportCallback, load_state, save_state


def digest(params: List[torch.Tensor]) -> str:
    """One short digest of a model's parameters (equal bytes, equal digest)."""
    return hashlib.sha1(b"".join(p.detach().cpu().contiguous().numpy().tobytes() for p in params)).hexdigest()


def finetune(config: Dict[str, Any]) -> None:
    """On each trainer worker: load the warm state by name, set the trial's learning rate, train, report."""
    model = prepare_model(torch.nn.Linear(10, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    load_state(train.get_checkpoint(), model=model, opt=opt)
    first = digest(list(model.parameters()))
    for group in opt.param_groups:
        group["lr"] = config["lr"]
    g = torch.Generator().manual_seed(train.get_context().get_world_rank())
    for step in range(config["steps"]):
        x = torch.randn(32, 10, generator=g)
        loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with tempfile.TemporaryDirectory() as tmp:
            train.report({"loss": loss.item(), "step": step, "first": first},
                         checkpoint=save_state(tmp, model=model, opt=opt))


def trial(config: Dict[str, Any], warm: Any = None, storage: str = "") -> None:
    """A Tune function trainable: our TorchTrainer started from ``warm``; every report goes to Tune."""
    trainer = TorchTrainer(finetune, train_loop_config={"lr": config["lr"], "steps": config["steps"]},
                           scaling_config=train.ScalingConfig(num_workers=1), resume_from_checkpoint=warm,
                           run_config=train.RunConfig(storage_path=storage, callbacks=[TuneReportCallback()]))
    trainer.fit()
