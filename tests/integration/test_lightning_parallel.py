"""Lightning's FSDP2 route without Ray: the mesh sized to the group, what is refused in one line, and prepare_trainer
turning Lightning's own ModelParallelStrategy into ours (the group round trips are in tests/sharded)."""
from __future__ import annotations

import pytest

pl = pytest.importorskip("lightning.pytorch")


def test_the_mesh_spans_the_group_and_tensor_parallel_is_refused_in_one_line():
    from raytrain_nb._internal.errors import ConfigError, NotSupportedError
    from raytrain_nb._internal.frameworks.lightning_parallel import mesh_sizes

    assert mesh_sizes("auto", "auto", 3) == (3, 1)  # Lightning's own "auto" would be (nodes, devices): (1, 1)
    assert mesh_sizes(2, 1, 2) == (2, 1)
    with pytest.raises(NotSupportedError, match=r"^ModelParallelStrategy\(tensor_parallel_size=2\) \(a 2-D mesh: "
                                                r"tensor parallel\) is not supported here: pass tensor_parallel_size=1"):
        mesh_sizes("auto", 2, 4)
    with pytest.raises(ConfigError, match=r"^ModelParallelStrategy\(data_parallel_size=3\): the mesh spans the "
                                          r"group's 2 ranks: pass data_parallel_size=2 or 'auto'$"):
        mesh_sizes(3, 1, 2)
    with pytest.raises(ConfigError, match=r"^ModelParallelStrategy\(data_parallel_size=0\): pass 'auto' or a whole"):
        mesh_sizes(0, "auto", 1)


def test_prepare_trainer_makes_lightnings_model_parallel_strategy_the_groups():
    from lightning.pytorch.strategies import ModelParallelStrategy

    from raytrain_nb._internal.errors import NotSupportedError
    from raytrain_nb._internal.worker.session import TrainContext, WorkerSession, set_session
    from raytrain_nb.lightning import RayLightningEnvironment, RayModelParallelStrategy, prepare_trainer

    options = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False)
    set_session(WorkerSession(TrainContext(1, 2, 1, 2, 0)))  # a worker's context: the Trainer asks its rank
    try:
        trainer = pl.Trainer(strategy=ModelParallelStrategy(save_distributed_checkpoint=False),
                             plugins=[RayLightningEnvironment()], **options)
        strategy = trainer.strategy
        assert prepare_trainer(trainer) is trainer and trainer.strategy is strategy  # the same object, now ours
        assert type(strategy) is RayModelParallelStrategy and strategy.asked_sizes == ("auto", "auto")
        # the worker's device, where Lightning's would index its devices by the local rank (1 of 1 CPU device)
        assert strategy.keep_optimizer_state and strategy.root_device.type == "cpu"
        assert prepare_trainer(trainer) is trainer  # again: nothing changes

        two_d = pl.Trainer(strategy=ModelParallelStrategy(data_parallel_size=1, tensor_parallel_size=2),
                           plugins=[RayLightningEnvironment()], **options)
        with pytest.raises(NotSupportedError, match=r"^ModelParallelStrategy\(tensor_parallel_size=2\)"):
            prepare_trainer(two_d)
        assert type(two_d.strategy) is ModelParallelStrategy  # refused: left as it was
    finally:
        set_session(None)
    with pytest.raises(NotSupportedError, match=r"tensor_parallel_size=1 \(FSDP2 over every rank of the group\)"):
        RayModelParallelStrategy(tensor_parallel_size=4)


def test_ray_model_parallel_strategy_refuses_another_environment_and_a_worker_without_a_process_group():
    import torch
    from lightning.pytorch.plugins.environments import LightningEnvironment

    from raytrain_nb._internal.worker.session import TrainContext, WorkerSession, set_session
    from raytrain_nb.lightning import RayLightningEnvironment, RayModelParallelStrategy

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def configure_model(self):
            pass

        def training_step(self, batch, i):
            return self.net(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)
    options = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, max_epochs=1)
    with pytest.raises(RuntimeError, match=r"^RayModelParallelStrategy needs Lightning's cluster environment to be "
                                           r"RayLightningEnvironment, got LightningEnvironment"):
        pl.Trainer(strategy=RayModelParallelStrategy(), plugins=[LightningEnvironment()], **options).fit(Net(), loader)
    set_session(WorkerSession(TrainContext(1, 2, 1, 2, 0)))  # rank 1 of 2 on one node, but no process group
    try:
        trainer = pl.Trainer(strategy=RayModelParallelStrategy(), plugins=[RayLightningEnvironment()], **options)
        assert (trainer.world_size, trainer.global_rank, trainer.strategy.root_device.type) == (2, 1, "cpu")
        with pytest.raises(RuntimeError, match=r"^RayModelParallelStrategy trains on the worker group's process "
                                               r"group and this process has none: run fit\(\) in a %%distributed"):
            trainer.fit(Net(), loader)
    finally:
        set_session(None)


def test_in_local_mode_a_sharded_module_trains_on_a_group_of_this_process_and_its_checkpoint_is_reported():
    import os

    import torch
    import torch.distributed as dist

    from raytrain_nb import ScalingConfig
    from raytrain_nb.lightning import RayLightningEnvironment, RayModelParallelStrategy, RayTrainReportCallback
    from raytrain_nb.torch import TorchTrainer

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def configure_model(self):
            from torch.distributed.fsdp import fully_shard  # FSDP2: once Lightning made the mesh

            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

        def training_step(self, batch, i):
            loss = self.net(batch[0]).pow(2).mean()
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_func():  # as under Ray Train's local mode: Lightning forms a group of this one process
        trainer = pl.Trainer(strategy=RayModelParallelStrategy(), plugins=[RayLightningEnvironment()],
                             callbacks=[RayTrainReportCallback()], accelerator="cpu", logger=False,
                             enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False,
                             max_epochs=1)
        module = Net()
        trainer.fit(module, torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)),
                                                        batch_size=4))
        return tuple(trainer.strategy.device_mesh.shape), type(module.net.weight).__name__

    result = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=0)).fit()
    assert result.return_value == ((1, 1), "DTensor") and not dist.is_initialized()
    assert sorted(os.listdir(os.path.join(result.checkpoint.path, "checkpoint.ckpt"))) == \
        [".metadata", "__0_0.distcp", "meta.pt"]
