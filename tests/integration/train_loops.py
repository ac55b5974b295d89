"""Training functions for the trainer tests (pickled by value, so workers need not import tests/).

``deterministic_loop``: the data of each step depends only on (step, rank), the model and optimizer
state are checkpointed on every step by rank 0, so a run that crashes and resumes from its newest
checkpoint ends with exactly the parameters of an uninterrupted run.
"""
from __future__ import annotations

import os
import signal
import tempfile
from typing import Any, Dict, List

import torch

import raytrain_nb as train
from raytrain_nb import Checkpoint
from raytrain_nb.torch import prepare_model

BATCH = 8


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def make_optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    x = torch.randn(BATCH, 4, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin()


def deterministic_loop(config: Dict[str, Any]) -> None:
    model = make_model()
    opt = make_optimizer(model)
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        start = int(state["step"]) + 1
    ddp = prepare_model(model)
    ctx = train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    fail = config.get("fail") or {}
    for step in range(start, config["steps"]):
        x, y = batch(step, rank)
        loss = (ddp(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step},
                           os.path.join(d, "state.pt"))
            train.report({"step": step, "loss": loss.item(), "world_size": world, "start": start},
                         checkpoint=Checkpoint.from_directory(d) if rank == 0 else None)
        if fail and step == fail["step"] and rank == fail["rank"] and not os.path.exists(fail["marker"]):
            open(fail["marker"], "w").close()
            if fail["how"] == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"injected failure at step {step}")
    if rank == 0:
        print(f"finished at step {config['steps'] - 1}")


def reference_params(steps: int, world: int = 2) -> List[torch.Tensor]:
    """The same training in one process: DDP averages gradients = the mean loss over all ranks' batches."""
    model = make_model()
    opt = make_optimizer(model)
    for step in range(steps):
        xs, ys = zip(*(batch(step, r) for r in range(world)))
        loss = (model(torch.cat(xs)) - torch.cat(ys)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def checkpoint_params(ckpt: Checkpoint) -> List[torch.Tensor]:
    with ckpt.as_directory() as d:
        state = torch.load(os.path.join(d, "state.pt"), weights_only=True)
    model = make_model()
    model.load_state_dict(state["model"])
    return [p.detach().clone() for p in model.parameters()]


def shard_loop(config: Dict[str, Any]) -> None:
    """Reads this rank's shard of ``train`` for ``epochs`` epochs; reports the ids of each epoch."""
    it = train.get_dataset_shard("train")
    for epoch in range(config.get("epochs", 1)):
        ids: List[int] = []
        for b in it.iter_batches(batch_size=16, batch_format="numpy"):
            ids.extend(int(v) for v in b["id"])
        print(f"epoch {epoch}: {len(ids)} rows")
        train.report({"epoch": epoch, "ids": ids, "world_size": train.get_context().get_world_size()})


def raising_loop() -> None:
    def inner_helper(x):
        return 1 / x

    train.report({"step": 0})
    inner_helper(0)


def returning_loop(config: Dict[str, Any]) -> Dict[str, Any]:
    """Reports once and returns what differs by rank: only rank 0's return value reaches ``Result.return_value``."""
    ctx = train.get_context()
    train.report({"step": 0})
    return {"rank": ctx.get_world_rank(), "world_size": ctx.get_world_size(), "tag": config["tag"]}
