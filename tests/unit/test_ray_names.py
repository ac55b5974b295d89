"""Ray Train's names that exist here: what each honours, and what each refuses, in one line naming the way out."""
import logging
import os

import pytest

import raytrain_nb
from raytrain_nb import (BackendConfig, CheckpointConsistencyMode, CheckpointUploadMode, ConfigError, DataConfig,
                         LoggingConfig, NotSupportedError, PreemptionInfo, Result, RunConfig, ScalingConfig,
                         SyncConfig, ValidationConfig, ValidationTaskConfig)
from raytrain_nb._internal.worker import session
from raytrain_nb._internal.worker.session import TrainContext, WorkerSession


def refused(call, match):
    """``call()`` raises a one-line NotSupportedError (a NotImplementedError) matching ``match``."""
    with pytest.raises(NotSupportedError, match=match) as info:
        call()
    assert isinstance(info.value, NotImplementedError) and isinstance(info.value, ConfigError)
    assert "\n" not in str(info.value)
    return str(info.value)


@pytest.fixture
def worker_session():
    sess = WorkerSession(TrainContext(world_rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                                      experiment_name="exp"))
    session.set_session(sess)
    yield sess
    session.set_session(None)


def test_scaling_config_answers_as_ray_trains_properties():
    cpu = ScalingConfig(num_workers=3, resources_per_worker={"CPU": 2, "special": 1, "memory": 0})
    assert (cpu.num_cpus_per_worker, cpu.num_gpus_per_worker, cpu.num_tpus_per_worker) == (2, 0, 0)
    assert cpu.additional_resources_per_worker == {"special": 1}
    assert cpu.total_resources == {"CPU": 6, "special": 3}
    gpu = ScalingConfig(num_workers=(2, 4), use_gpu=True, resources_per_worker={"CPU": 4})
    assert gpu.num_gpus_per_worker == 1 and gpu.total_resources == {"CPU": 16, "GPU": 4}
    assert gpu.elasticity_enabled and ScalingConfig(num_workers=(2, 2)).elasticity_enabled
    assert not ScalingConfig(num_workers=(2, 2)).elastic
    # accelerator_type without GPUs: CPU workers on nodes with that accelerator, as in Ray Train
    a100 = ScalingConfig(num_workers=2, accelerator_type="A100")
    assert a100.group_kwargs() == {"cpus_per_worker": 1, "gpus_per_worker": 0, "placement_strategy": "PACK",
                                   "resources_per_worker": {"accelerator_type:A100": 0.001}}
    refused(cpu.as_placement_group_factory, r"as_placement_group_factory\(\).*tune.with_resources")
    refused(lambda: ScalingConfig.from_placement_group_factory(None), r"build ScalingConfig\(num_workers=")


def test_refused_config_arguments_are_not_implemented_errors():
    refused(lambda: RunConfig(stop={"loss": 0.1}), r"RunConfig\(stop=\{'loss': 0.1\}\): stop is a Ray Tune option")
    refused(lambda: RunConfig(sync_config=SyncConfig()), r"sync_config=SyncConfig\(")
    refused(lambda: DataConfig(execution_options={}), r"execution_options=\{\}\)")
    refused(lambda: RunConfig().storage_context, r"RunConfig.storage_context .* result.path names it")
    refused(DataConfig.default_ingest_options, r"default_ingest_options\(\)")
    assert SyncConfig(60).sync_period == 60  # it can be built, as in Ray Train; passing it is refused


def test_backend_config_members():
    from raytrain_nb.torch import TorchConfig

    assert TorchConfig("gloo").to_dict() == {"backend": "gloo", "init_method": "env", "timeout_s": 1800}
    assert (TorchConfig().framework, BackendConfig().framework) == ("torch", None)
    with BackendConfig().train_func_context():
        pass
    refused(lambda: TorchConfig().backend_cls, r"TorchConfig.backend_cls .*choose a backend with TorchConfig")


def test_logging_config_sets_this_librarys_level_for_the_block():
    logger = logging.getLogger("raytrain_nb")
    before = logger.level
    with LoggingConfig("debug").applied():
        assert logger.level == logging.DEBUG
    assert logger.level == before


def test_data_config_configure_splits_as_told(monkeypatch):
    calls = []

    class FakeDataset:
        def streaming_split(self, n, equal, locality_hints=None):
            calls.append((n, equal, locality_hints))
            return [f"shard{i}" for i in range(n)]

        def iterator(self):
            return "whole"

    data = {"train": FakeDataset(), "valid": FakeDataset()}
    per_rank = DataConfig(["train"]).configure(data, 2, None, ["node-a", "node-b"])
    assert per_rank == [{"train": "shard0", "valid": "whole"}, {"train": "shard1", "valid": "whole"}]
    assert calls == [(2, True, ["node-a", "node-b"])]
    DataConfig(enable_shard_locality=False).configure({"train": FakeDataset()}, 2, None, ["node-a", "node-b"])
    assert calls[-1] == (2, True, None)


def test_report_honours_a_sync_upload_with_delete_and_checks_the_other_options(worker_session, tmp_path):
    uploaded = []
    worker_session.upload = lambda index, checkpoint, metrics: uploaded.append(os.listdir(checkpoint.path))
    (tmp_path / "model.pt").write_text("w")
    ckpt = raytrain_nb.Checkpoint.from_directory(str(tmp_path))
    raytrain_nb.report({"loss": 1.0}, checkpoint=ckpt, checkpoint_upload_mode=CheckpointUploadMode.SYNC,
                       delete_local_checkpoint_after_upload=True)
    assert uploaded == [["model.pt"]] and not tmp_path.exists()  # uploaded first, then deleted
    with pytest.raises(ValueError, match=r"checkpoint_upload_mode='ASYNC'\) is not an upload mode"):
        raytrain_nb.report({}, checkpoint_upload_mode="ASYNC")
    with pytest.raises(ValueError, match=r"no validation function was given"):
        raytrain_nb.report({}, checkpoint=ckpt, validation=ValidationTaskConfig())
    assert worker_session.reports_this_cell == 1  # nothing refused was queued
    assert CheckpointUploadMode.ASYNC.default_delete_local_checkpoint_after_upload()


def test_context_and_functions_ray_train_v2_has(worker_session, monkeypatch):
    ctx = raytrain_nb.get_context()
    assert ctx.get_metadata() == {} and ctx.get_trial_name() == "exp"
    worker_session.metadata = {"owner": "me"}
    assert ctx.get_metadata() == {"owner": "me"}
    for method in (ctx.get_trial_id, ctx.get_trial_dir, ctx.get_trial_resources):
        refused(method, r"get_trial_.*\(\).*train_loop_config")
    refused(ctx.get_storage, r"get_storage\(\).*<storage_path>/<name>")
    assert raytrain_nb.get_all_reported_checkpoints() == []  # no run directory (as in Ray Train's local mode)
    refused(raytrain_nb.get_preemption_info, r"get_preemption_info\(\).*max_failures")
    monkeypatch.setattr(session, "_SHARDS", {"train": "the train shard"})
    assert raytrain_nb.get_dataset_shard() == "the train shard" == raytrain_nb.get_dataset_shard(dataset_name="train")
    assert raytrain_nb.TRAIN_DATASET_KEY == "train"


def test_v2_shapes_exist_as_ray_train_builds_them():
    info = PreemptionInfo(deadline_ms=5, preempted_node_to_ranks={"b": [3, 2], "a": [1]})
    assert (info.preempted_node_ids, info.preempted_ranks) == (["a", "b"], [1, 2, 3])
    config = ValidationConfig(lambda checkpoint, **kw: {"acc": 1.0}, ValidationTaskConfig({"split": "val"}))
    assert config.task_config.fn_kwargs == {"split": "val"} and config.ray_remote_kwargs == {}
    assert [m.name for m in CheckpointConsistencyMode] == ["COMMITTED", "VALIDATED"]
    assert raytrain_nb.DataParallelTrainer(lambda: None, validation_config=config).validation_config is config
    with pytest.raises(raytrain_nb.ConfigError, match=r"validation_config=.*ValidationConfig\(fn\)"):
        raytrain_nb.DataParallelTrainer(lambda: None, validation_config=print)
    with pytest.raises(ValueError, match=r"timeout_s=0.*None \(no timeout\)"):
        ValidationTaskConfig(timeout_s=0)
    refused(lambda: raytrain_nb.DataParallelTrainer.restore("/runs/x"), r"restore\(\).*same RunConfig\(name=")
    refused(raytrain_nb.DataParallelTrainer.can_restore, r"can_restore\(\)")


def test_result_takes_ray_trains_arguments():
    result = Result({"loss": 1.0}, None, None, "/runs/a", "a frame", [("c", {"loss": 1.0})], None, 7)
    assert (result.metrics_dataframe, result.best_checkpoints, result.return_value) == ("a frame", [("c", {"loss":
                                                                                                          1.0})], 7)
    assert Result(None, None, None, None).best_checkpoints == []
    refused(lambda: result.config, r"Result.config .*train_loop_config")


def test_user_callback_has_ray_trains_hooks():
    from raytrain_nb._internal.train.callbacks import CallbackRunner, TrainRunContext

    seen = []

    class RayStyle(raytrain_nb.UserCallback):
        def after_report(self, run_context, metrics, checkpoint):
            seen.append(("ray", run_context.name, metrics[0]["loss"]))

    class Short(raytrain_nb.UserCallback):
        def after_report(self, metrics, checkpoint):
            seen.append(("short", metrics[0]["loss"]))

    runner = CallbackRunner([RayStyle(), Short(), raytrain_nb.UserCallback()], TrainRunContext("run", "/r", 1))
    runner.after_report([{"loss": 0.5}], None)
    runner.after_exception({0: ValueError("x")})
    assert seen == [("ray", "run", 0.5), ("short", 0.5)]


def test_torch_names(tmp_path):
    torch = pytest.importorskip("torch")
    from raytrain_nb.torch import TorchCheckpoint, accelerate

    accelerate()  # amp=False: nothing to do
    refused(lambda: accelerate(amp=True), r"accelerate\(amp=True\).*torch.autocast")
    model = torch.nn.Linear(3, 1)
    ddp_style = {f"module.{k}": v for k, v in model.state_dict().items()}
    checkpoint = TorchCheckpoint.from_state_dict(ddp_style)
    assert os.listdir(checkpoint.path) == ["model.pt"] and checkpoint.get_preprocessor() is None
    loaded = checkpoint.get_model(torch.nn.Linear(3, 1))
    assert torch.equal(loaded.weight, model.weight)
    refused(checkpoint.get_model, r"get_model\(\) without a model.*get_model\(make_model\(\)\)")
    refused(lambda: TorchCheckpoint.from_model(model), r"from_model\(\).*from_state_dict\(model.state_dict\(\)\)")


def test_prepare_model_moves_to_the_device_given():
    torch = pytest.importorskip("torch")
    from raytrain_nb.torch import prepare_model

    model = prepare_model(torch.nn.Linear(3, 1), move_to_device=torch.device("meta"), parallel_strategy=None)
    assert model.weight.device.type == "meta"
    kept = prepare_model(torch.nn.Linear(3, 1), move_to_device=False, parallel_strategy=None)
    assert kept.weight.device.type == "cpu"
    with pytest.raises(ValueError,
                       match=r"prepare_model\(parallel_strategy='zero'\): use 'ddp', 'fsdp', 'fsdp2' or None"):
        prepare_model(torch.nn.Linear(3, 1), parallel_strategy="zero")
    with pytest.raises(RuntimeError, match=r"parallel_strategy='fsdp'\) needs a process group"):
        prepare_model(torch.nn.Linear(3, 1), parallel_strategy="fsdp")  # no process group in this process


def test_snapshots_refuse_an_fsdp_model_and_never_copy_its_shards():
    torch = pytest.importorskip("torch")
    from raytrain_nb._internal.errors import SnapshotError
    from raytrain_nb._internal.worker.snapshot import find_tracked

    class FullyShardedDataParallel(torch.nn.Module):  # stands for FSDP1's wrapper: found by its class name
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Linear(2, 2)

    sharded = FullyShardedDataParallel()
    namespace = {"model": sharded, "opt": torch.optim.SGD(sharded.parameters(), lr=0.1), "other": torch.nn.Linear(1, 1)}
    with pytest.raises(SnapshotError, match=r"'model' is an FSDP model .* torch.distributed.checkpoint"):
        find_tracked(namespace)
    tracked = find_tracked(namespace, strict=False)  # re-forming: the shards and their optimizer stay as they are
    assert list(tracked.modules) == ["other"] and tracked.optimizers == {}


def test_metadata_reaches_the_loop_in_local_mode(tmp_path):
    def loop():
        return raytrain_nb.get_context().get_metadata()

    trainer = raytrain_nb.DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=0),
                                              run_config=RunConfig("meta", str(tmp_path)), metadata={"owner": "me"})
    assert trainer.fit().return_value == {"owner": "me"}
