"""Lightning's FSDP2 route (``ModelParallelStrategy``) on a real group: in cells, the mesh spans the group's ranks and
the module's parameters are DTensor shards, which snapshots and rollback round-trip (gathered full tensors equal);
in a trainer, each epoch's checkpoint holds every rank's shards and a new run resumes from it."""
from __future__ import annotations

import os

import pytest
import torch

from raytrain_nb import WorkerGroup

from ..groups import each_rank, quiet

pytest.importorskip("lightning")

#: A LightningModule that shards itself in configure_model (Lightning's guide), made with Lightning's own strategy.
BUILD = """
import torch, lightning.pytorch as pl
from lightning.pytorch.strategies import ModelParallelStrategy
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from raytrain_nb.lightning import RayLightningEnvironment, prepare_trainer

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2))
    def configure_model(self):
        if isinstance(self.blocks[0].weight, DTensor):
            return  # sharded by a previous fit: Lightning calls this at every fit
        mesh = self.device_mesh["data_parallel"]
        fully_shard(self.blocks[0], mesh=mesh)
        fully_shard(self.blocks[2], mesh=mesh)
        fully_shard(self.blocks, mesh=mesh)
    def training_step(self, batch, i):
        loss = torch.nn.functional.mse_loss(self.blocks(batch[0]), batch[1])
        self.log("loss", loss)
        return loss
    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)

g = torch.Generator().manual_seed(0)
data = torch.utils.data.TensorDataset(torch.randn(64, 8, generator=g), torch.randn(64, 2, generator=g))
loader = torch.utils.data.DataLoader(data, batch_size=8)

def make_trainer():
    return prepare_trainer(pl.Trainer(max_epochs=1, strategy=ModelParallelStrategy(), plugins=[RayLightningEnvironment()],
                                      accelerator="cpu", devices="auto", logger=False, enable_progress_bar=False,
                                      enable_model_summary=False, enable_checkpointing=False))

def full():
    params = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    moments = {k: {n: (t.full_tensor() if hasattr(t, 'full_tensor') else t).clone() for n, t in s.items()}
               for k, s in enumerate(trainer.optimizers[0].state.values())}
    return params, moments

torch.manual_seed(0)
model = Net()
model_id = id(model)
"""
FIT = "trainer = make_trainer()\ntrainer.fit(model, train_dataloaders=loader)\n"


@pytest.fixture(scope="module")
def group(ray_session, tmp_path_factory):
    group = WorkerGroup(2, storage_path=str(tmp_path_factory.mktemp("runs")), name="lightning-sharded")
    quiet(group, BUILD)
    quiet(group, FIT)
    yield group
    group.shutdown()


def full_state(group):
    quiet(group, "_full = full()")
    return group.pull("_full", rank=0)


def assert_same(a, b):
    assert a[0].keys() == b[0].keys() and a[1].keys() == b[1].keys()
    for k in a[0]:
        assert torch.equal(a[0][k], b[0][k]), k
    for k in a[1]:
        for n in a[1][k]:
            assert torch.equal(a[1][k][n], b[1][k][n]), (k, n)


def test_the_mesh_spans_the_group_and_the_module_is_sharded(group):
    out = each_rank(group, "(type(trainer.strategy).__name__, tuple(trainer.strategy.device_mesh.shape), "
                           "trainer.world_size, type(model.blocks[0].weight).__name__, "
                           "model.blocks[0].weight.to_local().shape[0], model.blocks[0].weight.shape[0])")
    assert out == [("RayModelParallelStrategy", (2, 1), 2, "DTensor", 8, 16)] * 2  # each rank: half the rows
    rows = group.status()
    assert [r.shard.split(":")[0] for r in rows] == ["fsdp2 1/2"] * 2  # the group sees a sharded model


def test_snapshot_and_rollback_round_trip_the_shards_and_the_optimizer(group):
    before = full_state(group)
    entry = group.checkpoint(name="lightning-a")
    assert sorted(os.listdir(os.path.join(entry.path, "sharded"))) == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    quiet(group, FIT)  # a later cell: a new Trainer, the same warm module, its AdamW state carried
    with pytest.raises(AssertionError):
        assert_same(before, full_state(group))
    group.rollback("lightning-a")
    assert_same(before, full_state(group))
    assert each_rank(group, "id(model) == model_id") == [True, True]
    steps = each_rank(group, "[float(s['step']) for s in trainer.optimizers[0].state.values()]")
    quiet(group, FIT)  # training goes on, from the rolled-back state
    after = each_rank(group, "[float(s['step']) for s in trainer.optimizers[0].state.values()]")
    assert after == [[s + 4 for s in steps[0]]] * 2  # 4 batches per rank: carried, then stepped


@pytest.mark.timeout(600)
def test_a_trainer_commits_every_ranks_shards_and_a_new_run_resumes_from_them(ray_session, tmp_path):
    from raytrain_nb import RunConfig, ScalingConfig
    from raytrain_nb.torch import TorchTrainer

    def train_func(config):
        import lightning.pytorch as pl
        import torch
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor import DTensor

        import raytrain_nb as train
        from raytrain_nb.lightning import RayLightningEnvironment, RayModelParallelStrategy, RayTrainReportCallback

        class Net(pl.LightningModule):
            def __init__(self):
                super().__init__()
                self.blocks = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1))

            def configure_model(self):
                if not isinstance(self.blocks[0].weight, DTensor):
                    fully_shard(self.blocks, mesh=self.device_mesh["data_parallel"])

            def training_step(self, batch, i):
                loss = torch.nn.functional.mse_loss(self.blocks(batch[0]), batch[1])
                self.log("loss", loss)
                return loss

            def configure_optimizers(self):
                return torch.optim.AdamW(self.parameters(), lr=1e-2)

        g = torch.Generator().manual_seed(0)
        data = torch.utils.data.TensorDataset(torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g))
        trainer = pl.Trainer(max_epochs=config["epochs"], strategy=RayModelParallelStrategy(),
                             plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
                             accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                             enable_checkpointing=False)
        loader = torch.utils.data.DataLoader(data, batch_size=8)
        checkpoint = train.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as d:
                trainer.fit(Net(), loader, ckpt_path=os.path.join(d, RayTrainReportCallback.CHECKPOINT_NAME))
        else:
            trainer.fit(Net(), loader)

    def run(epochs):
        return TorchTrainer(train_func, train_loop_config={"epochs": epochs},
                            scaling_config=ScalingConfig(num_workers=2),
                            run_config=RunConfig(name="lightning-fsdp2", storage_path=str(tmp_path))).fit()

    first = run(2)
    assert first.error is None and first.metrics["epoch"] == 1
    files = sorted(os.listdir(os.path.join(first.checkpoint.path, "checkpoint.ckpt")))
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "meta.pt"]  # every rank's shards, one checkpoint
    second = run(3)  # the same run again: resumes from epoch 1's checkpoint and trains epoch 2 only
    assert second.error is None and second.metrics["epoch"] == 2 and second.metrics["step"] == 3 * 2
