"""Trainer configs and arguments: bad values are rejected at once, naming the field and the value."""
import pytest

from raytrain_nb import (CheckpointConfig, ConfigError, DataConfig, DataParallelTrainer, FailureConfig, LoggingConfig,
                         NotSupportedError, RunConfig, ScalingConfig)
from raytrain_nb._internal.train.config import BackendConfig, TorchConfig


def loop(config):
    pass


@pytest.mark.parametrize("make,match", [
    (lambda: ScalingConfig(num_workers=-1), r"ScalingConfig\(num_workers=-1\): pass 1 or more workers, or 0 for "
                                            r"local mode \(the training function runs in this process\)$"),
    (lambda: ScalingConfig(num_workers=2.5), r"num_workers=2.5\): pass a whole number"),
    (lambda: ScalingConfig(num_workers="2"), r"num_workers='2'\)"),
    (lambda: ScalingConfig(num_workers=(3, 2)), r"num_workers=\(3, 2\)\): an elastic range needs 1 <= min <= max"),
    (lambda: ScalingConfig(num_workers=(0, 2)), r"num_workers=\(0, 2\)\)"),
    (lambda: ScalingConfig(num_workers=(1, 2, 3)), r"num_workers=\(1, 2, 3\)\): an elastic range is a \(min, max\)"),
    (lambda: ScalingConfig(use_gpu="yes"), r"use_gpu='yes'\): pass True or False"),
    (lambda: ScalingConfig(resources_per_worker=["CPU"]), r"resources_per_worker=\['CPU'\]\)"),
    (lambda: ScalingConfig(resources_per_worker={"CPU": -1}), r"resources_per_worker=.*'CPU' must be a number >= 0"),
    (lambda: ScalingConfig(resources_per_worker={"GPU": 1}), r"asks for GPUs but use_gpu=False"),
    (lambda: ScalingConfig(placement_strategy="RANDOM"), r"placement_strategy='RANDOM'\): use one of PACK"),
    (lambda: ScalingConfig(use_tpu=True), r"use_tpu=True\): TPUs are not supported"),
    (lambda: ScalingConfig(accelerator_type=""), r"accelerator_type=''\): pass a name such as 'A100'"),
    (lambda: ScalingConfig(2), r"ScalingConfig\(trainer_resources=2\): the first argument is trainer_resources, as "
                               r"in Ray Train: write ScalingConfig\(num_workers=2\)"),
    (lambda: ScalingConfig(label_selector={"zone": "a"}), r"label_selector=\{'zone': 'a'\}\): placing workers by "
                                                          r"node labels is not supported"),
    (lambda: ScalingConfig(elastic_resize_monitor_interval_s=5), r"elastic_resize_monitor_interval_s=5\)"),
    (lambda: ScalingConfig(use_gpu=True, resources_per_worker={"GPU": 0}), r"asks for 0 GPUs but use_gpu=True"),
    (lambda: FailureConfig(controller_failure_limit=3), r"controller_failure_limit=3\): there is no controller"),
    (lambda: FailureConfig(max_preemption_failures=2), r"max_preemption_failures=2\): preemption notices"),
    (lambda: FailureConfig(preemption_grace_s=5.0), r"preemption_grace_s=5.0\)"),
    (lambda: FailureConfig(relax_collectives_on_preemption=True), r"relax_collectives_on_preemption=True\)"),
    (lambda: FailureConfig(max_failures=-2), r"FailureConfig\(max_failures=-2\): pass a whole number >= 0, or -1"),
    (lambda: FailureConfig(max_failures=1.5), r"max_failures=1.5"),
    (lambda: FailureConfig(fail_fast=True), r"fail_fast=True\): fail_fast is a Ray Tune option"),
    (lambda: CheckpointConfig(num_to_keep=0), r"CheckpointConfig\(num_to_keep=0\)"),
    (lambda: CheckpointConfig(checkpoint_score_attribute=""), r"checkpoint_score_attribute=''\)"),
    (lambda: CheckpointConfig(checkpoint_score_order="best"), r"checkpoint_score_order='best'\): use 'max' or 'min'"),
    (lambda: CheckpointConfig(checkpoint_frequency=5), r"checkpoint_frequency=5\): .*Ray Tune option"),
    (lambda: RunConfig(name="a/b"), r"RunConfig\(name='a/b'\): pass a non-empty name without '/'"),
    (lambda: RunConfig(name=""), r"RunConfig\(name=''\)"),
    (lambda: RunConfig(storage_path=3), r"RunConfig\(storage_path=3\)"),
    (lambda: RunConfig(failure_config={"max_failures": 1}), r"RunConfig\(failure_config=.*pass a raytrain_nb.FailureConfig"),
    (lambda: RunConfig(checkpoint_config=3), r"checkpoint_config=3\)"),
    (lambda: RunConfig(callbacks=object()), r"callbacks=.*pass a list"),
    (lambda: RunConfig(callbacks=[object()]), r"callbacks=.*needs an after_report or after_exception"),
    (lambda: RunConfig(stop={"loss": 0.1}), r"RunConfig\(stop=\{'loss': 0.1\}\): stop is a Ray Tune option"),
    (lambda: RunConfig(worker_runtime_env="env"), r"worker_runtime_env='env'\): pass a dict"),
    (lambda: RunConfig(logging_config="DEBUG"), r"logging_config='DEBUG'\): pass a raytrain_nb.LoggingConfig"),
    (lambda: LoggingConfig("LOUD"), r"LoggingConfig\(log_level='LOUD'\): use a logging level"),
    (lambda: DataConfig(enable_shard_locality="yes"), r"enable_shard_locality='yes'\): pass True or False"),
    (lambda: RunConfig(verbose=7), r"verbose=7\)"),
    (lambda: RunConfig(storage_filesystem="s3"), r"storage_filesystem='s3'\): pass a pyarrow"),
    (lambda: DataConfig(datasets_to_split="train"), r"DataConfig\(datasets_to_split='train'\)"),
    (lambda: TorchConfig(backend="mpi"), r"TorchConfig\(backend='mpi'\): use one of gloo"),
    (lambda: TorchConfig(timeout_s=0), r"TorchConfig\(timeout_s=0\): pass a number of seconds > 0"),
    (lambda: BackendConfig(backend="x"), r"BackendConfig\(backend='x'\)"),
])
def test_bad_config_names_the_field_and_value(make, match):
    with pytest.raises(ConfigError, match=match) as info:
        make()
    assert isinstance(info.value, ValueError) and "\n" not in str(info.value)


def test_configs_take_ray_trains_arguments_by_position_and_defaults_follow_ray_train():
    assert RunConfig("exp").name == "exp" and CheckpointConfig(2).num_to_keep == 2
    assert FailureConfig(3).max_failures == 3 and TorchConfig("gloo", "env", 60).timeout_s == 60
    assert ScalingConfig(None, 2).num_workers == 2 and LoggingConfig("debug").log_level == "DEBUG"
    assert DataConfig(["train"], None, False).enable_shard_locality is False
    s = ScalingConfig(num_workers=[2, 4])
    assert (s.elastic, s.min_workers, s.max_workers, s.num_workers) == (True, 2, 4, (2, 4))
    assert ScalingConfig().group_kwargs() == {"cpus_per_worker": 1.0, "gpus_per_worker": 0, "resources_per_worker": None,
                                              "placement_strategy": "PACK"}
    gpu = ScalingConfig(num_workers=2, use_gpu=True, accelerator_type="A100").group_kwargs()
    assert gpu["gpus_per_worker"] == 1.0 and gpu["cpus_per_worker"] == 0
    assert gpu["resources_per_worker"] == {"accelerator_type:A100": 0.001}
    custom = ScalingConfig(resources_per_worker={"CPU": 2, "special": 1}).group_kwargs()
    assert custom["cpus_per_worker"] == 2 and custom["resources_per_worker"] == {"special": 1.0}
    assert RunConfig().max_failures == 0 and RunConfig(failure_config=FailureConfig(max_failures=-1)).max_failures == -1
    assert DataConfig(datasets_to_split=["train"]).splits("train") and not DataConfig(datasets_to_split=[]).splits("x")


@pytest.mark.parametrize("kwargs,match", [
    ({"scaling_config": {"num_workers": 2}}, r"DataParallelTrainer\(scaling_config=.*pass a raytrain_nb.ScalingConfig"),
    ({"run_config": 1}, r"run_config=1\)"),
    ({"train_loop_config": [1]}, r"train_loop_config=\[1\]\): pass a dict"),
    ({"backend": "mpi"}, r"BackendConfig\(backend='mpi'\)"),
    ({"backend": "nccl"}, r"DataParallelTrainer\(backend='nccl'\): nccl needs GPUs"),
    ({"datasets": {"train": [1, 2, 3]}}, r"datasets\['train'\] is a list, not a ray.data.Dataset"),
    ({"datasets": [1]}, r"datasets=list"),
    ({"resume_from_checkpoint": "/tmp/x"}, r"resume_from_checkpoint='/tmp/x'\): pass a raytrain_nb.Checkpoint"),
])
def test_bad_trainer_arguments(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        DataParallelTrainer(loop, **kwargs)


def test_train_function_takes_none_or_one_argument():
    def two(a, b):
        pass

    with pytest.raises(ConfigError, match=r"train_loop_per_worker='two' takes 2 parameters \(a, b\): it must take none or one"):
        DataParallelTrainer(two)
    with pytest.raises(ConfigError, match=r"train_loop_per_worker=3 is not a function"):
        DataParallelTrainer(3)
    assert DataParallelTrainer(lambda: None).with_config is False
    assert DataParallelTrainer(loop).with_config is True
    assert DataParallelTrainer(loop, backend="gloo").backend == "gloo"


def test_torch_trainer_backend_and_storage_filesystem(tmp_path):
    pytest.importorskip("torch")
    import fsspec

    from raytrain_nb.torch import TorchConfig as PublicTorchConfig
    from raytrain_nb.torch import TorchTrainer

    assert PublicTorchConfig is TorchConfig
    assert TorchTrainer(loop).backend == "gloo"
    assert TorchTrainer(loop, torch_config=TorchConfig(backend="gloo")).backend == "gloo"
    with pytest.raises(ConfigError, match=r"TorchTrainer\(backend_config=.*not both"):
        TorchTrainer(loop, torch_config=TorchConfig(), backend_config=TorchConfig())
    local = TorchTrainer(loop, run_config=RunConfig(storage_path=str(tmp_path),
                                                    storage_filesystem=fsspec.filesystem("file")))
    assert local.storage_path == str(tmp_path)
    pa_fs = pytest.importorskip("pyarrow.fs")
    assert TorchTrainer(loop, run_config=RunConfig(storage_path=str(tmp_path),
                                                   storage_filesystem=pa_fs.LocalFileSystem())).storage_path == str(tmp_path)
    mem = fsspec.filesystem("memory")
    assert TorchTrainer(loop, run_config=RunConfig(storage_path="/runs", storage_filesystem=mem)).storage_path \
        == "memory:///runs"
    with pytest.raises(ConfigError, match=r"storage_filesystem=.*options cannot reach them"):
        TorchTrainer(loop, run_config=RunConfig(storage_path="bucket/runs",
                                                storage_filesystem=pa_fs.S3FileSystem(anonymous=True)))
