"""Ray Train's FSDP2 guide, its training function on CPU with synthetic data: a model sharded by hand with
``fully_shard`` (each layer, then the root), an ``AppState`` that saves and loads model and optimizer through
``torch.distributed.checkpoint`` (DCP), each rank saving into a directory it reports with
``Checkpoint.from_directory``, and a second run at another world size that resumes from the last checkpoint
(DCP reshards it).

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports
(``ray.train`` -> ``raytrain_nb``, ``ray.train.torch`` -> ``raytrain_nb.torch``). The guide's device is the GPU and
its data a dataset; here the device is the CPU (gloo) and the data random tensors.
"""
import os
import tempfile

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import ray.train as train
from ray.train import Checkpoint, RunConfig, ScalingConfig
from ray.train.torch import TorchConfig, TorchTrainer


class AppState(Stateful):
    """The guide's wrapper: DCP calls state_dict() / load_state_dict() on it."""

    def __init__(self, model, optimizer=None):
        self.model = model
        self.optimizer = optimizer

    def state_dict(self):
        model_state_dict, optimizer_state_dict = get_state_dict(self.model, self.optimizer)
        return {"model": model_state_dict, "optim": optimizer_state_dict}

    def load_state_dict(self, state_dict):
        set_state_dict(self.model, self.optimizer, model_state_dict=state_dict["model"],
                       optim_state_dict=state_dict["optim"])


class Net(torch.nn.Module):
    def __init__(self, width=32, depth=4):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.Linear(width, width) for _ in range(depth)])
        self.out = torch.nn.Linear(width, 1)

    def forward(self, x):
        for layer in self.layers:
            x = torch.relu(layer(x))
        return self.out(x)


def full_tensors(model):
    """The full parameters (every rank joins the gathers)."""
    return {k: v.full_tensor().clone() for k, v in model.state_dict().items()}


def train_func(config):
    torch.manual_seed(0)
    world_size = train.get_context().get_world_size()
    rank = train.get_context().get_world_rank()
    model = Net()
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    start_epoch = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            state_dict = {"app": AppState(model, optimizer)}
            dcp.load(state_dict=state_dict, checkpoint_id=checkpoint_dir)
            start_epoch = int(open(os.path.join(checkpoint_dir, "epoch.txt")).read()) + 1
        resumed = full_tensors(model)
        if rank == 0 and config.get("expect"):
            saved = torch.load(config["expect"], weights_only=True)
            assert all(torch.equal(saved[k], resumed[k]) for k in saved), "resumed parameters differ"
            print(f"RESUMED AT {world_size} RANKS FROM EPOCH {start_epoch - 1}")

    for epoch in range(start_epoch, start_epoch + config["epochs"]):
        g = torch.Generator().manual_seed(1000 * epoch + rank)
        for _ in range(4):
            x = torch.randn(16, 32, generator=g)
            loss = (model(x) - x.sum(dim=1, keepdim=True)).pow(2).mean()
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        full = full_tensors(model)
        with tempfile.TemporaryDirectory() as checkpoint_dir:
            dcp.save({"app": AppState(model, optimizer)}, checkpoint_id=checkpoint_dir)
            if rank == 0:
                with open(os.path.join(checkpoint_dir, "epoch.txt"), "w") as f:
                    f.write(str(epoch))
                if config.get("expect"):
                    torch.save(full, config["expect"])
            train.report({"loss": loss.item(), "epoch": epoch},
                             checkpoint=Checkpoint.from_directory(checkpoint_dir))


def main(storage, expect):
    name = "fsdp2-guide"
    first = TorchTrainer(train_func, train_loop_config={"epochs": 2, "expect": expect},
                         scaling_config=ScalingConfig(num_workers=2, use_gpu=False),
                         torch_config=TorchConfig(backend="gloo"),
                         run_config=RunConfig(name=name, storage_path=storage)).fit()
    files = sorted(os.listdir(first.checkpoint.path))
    assert {".metadata", "__0_0.distcp", "__1_0.distcp", "epoch.txt"} <= set(files), files
    # the same run at 3 workers resumes from its latest checkpoint, written by 2 (elastic)
    second = TorchTrainer(train_func, train_loop_config={"epochs": 1, "expect": expect},
                          scaling_config=ScalingConfig(num_workers=3, use_gpu=False),
                          torch_config=TorchConfig(backend="gloo"),
                          run_config=RunConfig(name=name, storage_path=storage)).fit()
    assert second.metrics["epoch"] == 2, second.metrics
    print("FSDP2 GUIDE OK")


if __name__ == "__main__":
    storage = os.environ.get("RAYTRAIN_NB_STORAGE_PATH") or tempfile.mkdtemp()
    main(storage, os.path.join(tempfile.mkdtemp(), "expect.pt"))
