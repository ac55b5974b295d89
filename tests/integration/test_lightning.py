"""Lightning in script mode: Ray Train's Lightning example runs after changing only its imports, with a worker
killed mid-training and the run resumed from the newest checkpoint; what raytrain_nb refuses, in one line."""
from __future__ import annotations

import os
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

from .test_examples import port

pl = pytest.importorskip("lightning.pytorch")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "lightning_torch_trainer.py"


@pytest.mark.scripts
def test_example_runs_after_the_import_change_and_resumes_from_the_newest_checkpoint(ray_session, tmp_path, capsys):
    source = EXAMPLE.read_text()
    ported = port(source)
    changed = [(a, b) for a, b in zip(source.splitlines(), ported.splitlines()) if a != b]
    assert len(changed) == 4 and all(a.startswith(("import ray.train", "from ray.train")) and
                                     b.startswith(("import raytrain_nb", "from raytrain_nb")) for a, b in changed), changed
    assert "ray.train" not in ported.split('"""', 2)[2]
    path = tmp_path / EXAMPLE.name
    path.write_text(ported)
    # the example asserts that rank 1 was SIGKILLed, the run restarted once and resumed from a checkpoint, and
    # that the final checkpoint loads into the module
    runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr()
    assert "LIGHTNING OK" in out.out, out.out[-3000:]
    assert "Restored all states from the checkpoint" in out.out + out.err
    final = [line for line in out.out.splitlines() if line.startswith("final metrics:")][-1]
    assert "'start_epoch': 2.0" in final and "'epoch': 3" in final, final  # epoch 1's checkpoint: the newest
    assert "restart 1/1" in out.err, out.err[-3000:]


def test_fsdp_and_deepspeed_strategies_are_refused_naming_what_is_supported():
    from raytrain_nb.lightning import RayDeepSpeedStrategy, RayFSDPStrategy

    for cls in (RayFSDPStrategy, RayDeepSpeedStrategy):
        with pytest.raises(NotImplementedError, match=rf"^{cls.__name__} is not supported by raytrain_nb; "
                                                      r"supported: RayDDPStrategy \(DDP.*use FSDP2: Lightning's "
                                                      r"ModelParallelStrategy .*prepare_model"
                                                      r"\(model, parallel_strategy='fsdp2'\)"):
            cls(sharding_strategy="FULL_SHARD")


def test_prepare_trainer_and_the_callback_refuse_what_does_not_train_on_the_group():
    from lightning.pytorch.plugins.environments import LightningEnvironment

    from raytrain_nb.lightning import RayDDPStrategy, RayTrainReportCallback, prepare_trainer

    plain = pl.Trainer(accelerator="cpu", devices=1, logger=False, enable_progress_bar=False)
    with pytest.raises(RuntimeError, match=r"strategy is SingleDeviceStrategy; supported: RayDDPStrategy .*"
                                           r"pass pl.Trainer\(strategy=RayDDPStrategy\(\)\)"):
        prepare_trainer(plain)
    own_env = pl.Trainer(accelerator="cpu", strategy=RayDDPStrategy(), plugins=[LightningEnvironment()],
                         logger=False, enable_progress_bar=False)
    with pytest.raises(RuntimeError, match=r"cluster environment is LightningEnvironment: "
                                           r"pass pl.Trainer\(plugins=\[RayLightningEnvironment\(\)\]\)"):
        prepare_trainer(own_env)
    with pytest.raises(ValueError, match="validation=True.* is not supported by raytrain_nb"):
        RayTrainReportCallback(validation=True)


def test_a_missing_lightning_is_named_with_its_pip_install():
    code = "import sys; sys.modules['lightning'] = None\nimport raytrain_nb.lightning"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == \
        "ImportError: lightning is not installed: pip install 'raytrain_nb[lightning]'"


def test_optimizer_state_carries_to_the_next_fit_only_when_it_fits():
    import torch

    from raytrain_nb._internal.frameworks.lightning_carry import carry_optimizer_state, remember_optimizers

    module = torch.nn.Linear(3, 1)
    first = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    schedule = torch.optim.lr_scheduler.StepLR(first, 1, gamma=0.5)
    module(torch.ones(2, 3)).sum().backward()
    first.step()
    schedule.step()
    remember_optimizers(module, [first])
    assert carry_optimizer_state(torch.nn.Linear(3, 1), [first]) == ""  # another module: nothing remembered

    second = torch.optim.SGD(module.parameters(), lr=0.02, momentum=0.9)  # the next fit's configure_optimizers
    assert carry_optimizer_state(module, [second]) == "SGD"
    for p in module.parameters():
        assert torch.equal(second.state[p]["momentum_buffer"], first.state[p]["momentum_buffer"])
        assert second.state[p]["momentum_buffer"] is not first.state[p]["momentum_buffer"]
    assert second.param_groups[0]["lr"] == 0.02  # this fit's hyperparameters, not the old schedule's 0.05

    other_kind = torch.optim.Adam(module.parameters())
    assert carry_optimizer_state(module, [other_kind]) == ""
    assert not other_kind.state


def test_snapshots_find_the_module_and_what_its_trainer_made():
    import torch

    from raytrain_nb._internal.worker import rng
    from raytrain_nb._internal.worker.snapshot import capture, find_tracked, restore

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, i):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.1, momentum=0.9)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, 1)]

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4), torch.randn(16, 1)),
                                         batch_size=8)
    trainer = pl.Trainer(max_epochs=1, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    assert find_tracked({"trainer": trainer}).names() == []  # before a fit: nothing to find, no error
    model = Net()
    trainer.fit(model, loader)
    namespace = {"model": model, "trainer": trainer}
    tracked = find_tracked(namespace)
    assert tracked.names() == ["model", "trainer.lr_scheduler_configs[0].scheduler", "trainer.optimizers[0]"]
    assert find_tracked({"trainer": trainer}).modules == {"trainer.lightning_module": model}  # a module with no name

    replicated, own, _ = capture(namespace)
    draw = torch.rand(3)  # the next draw after the capture
    saved = [p.detach().clone() for p in model.parameters()]
    momentum = [s["momentum_buffer"].clone() for s in trainer.optimizers[0].state.values()]
    trainer = pl.Trainer(max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                         enable_model_summary=False, enable_checkpointing=False)
    trainer.fit(model, loader)  # moves the weights, new optimizers (their state carried by RayDDPStrategy only)
    namespace["trainer"] = trainer
    assert not all(torch.equal(a, b) for a, b in zip(saved, model.parameters()))
    restore(namespace, replicated, rng.decode(own["rng"]))
    assert all(torch.equal(a, b) for a, b in zip(saved, model.parameters()))
    assert torch.equal(torch.rand(3), draw)  # the generators are back where the capture found them
    assert all(torch.equal(a, s["momentum_buffer"]) for a, s in zip(momentum, trainer.optimizers[0].state.values()))


def test_ray_ddp_strategy_refuses_another_environment_and_a_worker_without_a_process_group():
    import torch
    from lightning.pytorch.plugins.environments import LightningEnvironment

    from raytrain_nb._internal.worker.session import TrainContext, WorkerSession, set_session
    from raytrain_nb.lightning import RayDDPStrategy, RayLightningEnvironment

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch, i):
            return self.net(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 2)), batch_size=2)
    options = dict(accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
                   enable_checkpointing=False, max_epochs=1)
    with pytest.raises(RuntimeError, match=r"RayDDPStrategy needs Lightning's cluster environment to be "
                                           r"RayLightningEnvironment, got LightningEnvironment"):
        pl.Trainer(strategy=RayDDPStrategy(), plugins=[LightningEnvironment()], **options).fit(Net(), loader)
    set_session(WorkerSession(TrainContext(0, 1, 0, 1, 0)))  # a worker's context, but no process group
    try:
        trainer = pl.Trainer(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()], **options)
        assert (trainer.world_size, trainer.global_rank) == (1, 0)
        with pytest.raises(RuntimeError, match=r"this process has none: run fit\(\) in a %%distributed cell"):
            trainer.fit(Net(), loader)
    finally:
        set_session(None)


def test_in_local_mode_ray_ddp_strategy_trains_on_a_process_group_of_its_own_and_leaves_none(tmp_path):
    import torch
    import torch.distributed as dist

    from raytrain_nb import ScalingConfig
    from raytrain_nb.lightning import RayDDPStrategy, RayLightningEnvironment, RayTrainReportCallback, prepare_trainer
    from raytrain_nb.torch import TorchTrainer

    class Net(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(2, 1)

        def training_step(self, batch, i):
            loss = self.net(batch[0]).pow(2).mean()
            self.log("loss", loss)
            return loss

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_func():  # as under Ray Train's local mode: Lightning forms a group of this one process
        trainer = prepare_trainer(pl.Trainer(
            strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()], callbacks=[RayTrainReportCallback()],
            accelerator="cpu", logger=False, enable_progress_bar=False, enable_model_summary=False,
            enable_checkpointing=False, max_epochs=2, default_root_dir=str(tmp_path)))
        loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(8, 2)), batch_size=4)
        trainer.fit(Net(), loader)
        return dist.get_world_size(), trainer.world_size

    result = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=0)).fit()
    assert result.return_value == (1, 1) and not dist.is_initialized()
    assert result.metrics["epoch"] == 1 and os.path.isdir(result.checkpoint.path)
