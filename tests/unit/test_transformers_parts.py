"""The logic of the Transformers integration and of the library resets, without Ray: which files each rank
uploads, the metrics reported, Ray Data batches as a dataset, prepare_trainer's refusals, Accelerate's and
Lightning's process-wide state pointed at a new rank and size, the variables that make Accelerate use the group."""
from __future__ import annotations

import sys
import types

import pytest

from raytrain_nb._internal.worker import library_state
from raytrain_nb._internal.worker.session import TrainContext, WorkerSession, set_session

transformers = pytest.importorskip("transformers")
hf = pytest.importorskip("raytrain_nb._internal.frameworks.transformers_utils")


def _touch(path):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(b"x")


def test_rank_0_uploads_the_shared_files_and_each_rank_only_its_own_rng_state(tmp_path):
    for name in ("model.safetensors", "optimizer.pt", "trainer_state.json", "rng_state_0.pth", "rng_state_1.pth",
                 "rng_state_12.pth", "sub/extra.bin"):
        _touch(tmp_path / name)
    assert hf.files_of_rank(str(tmp_path), 0) == ["model.safetensors", "optimizer.pt", "rng_state_0.pth",
                                                  "sub/extra.bin", "trainer_state.json"]
    assert hf.files_of_rank(str(tmp_path), 1) == ["rng_state_1.pth"]
    assert hf.files_of_rank(str(tmp_path), 12) == ["rng_state_12.pth"]
    assert hf.files_of_rank(str(tmp_path), 3) == []


def test_the_checkpoint_of_this_step_wins_over_a_newer_name_left_by_another_run(tmp_path):
    for step in (4, 10):
        (tmp_path / f"checkpoint-{step}").mkdir()
    assert hf.saved_checkpoint(str(tmp_path), 4).endswith("checkpoint-4")
    assert hf.saved_checkpoint(str(tmp_path), 7).endswith("checkpoint-10")  # no exact one: the newest, as Ray
    assert hf.saved_checkpoint(str(tmp_path / "missing"), 4) is None


def test_metrics_are_the_log_history_merged_newest_last():
    history = [{"loss": 2.0, "step": 2}, {"eval_loss": 1.5, "step": 2}, {"loss": 1.0, "step": 4}]
    assert hf.merged_metrics(history) == {"loss": 1.0, "eval_loss": 1.5, "step": 4}


def test_iterables_of_batches_become_a_loader_that_yields_them_unchanged():
    import torch

    batches = [{"x": torch.ones(2)}, {"x": torch.zeros(2)}]
    assert hf.is_batch_iterable(iter(batches)) and hf.is_batch_iterable((b for b in batches))
    assert not hf.is_batch_iterable(batches) and not hf.is_batch_iterable(torch.utils.data.TensorDataset(
        torch.ones(2)))
    out = list(hf.batch_loader(iter(batches)))
    assert len(out) == 2 and out[0]["x"].tolist() == [1.0, 1.0]


@pytest.fixture
def session():
    set_session(WorkerSession(TrainContext(world_rank=0, world_size=2, local_rank=0, local_world_size=2,
                                           node_rank=0)))
    yield
    set_session(None)


def test_prepare_trainer_refuses_what_is_not_a_trainer(session):
    with pytest.raises(TypeError, match=r"prepare_trainer\(\) takes a transformers.Trainer, got dict"):
        hf.prepare_trainer({})


def test_prepare_trainer_refuses_a_trainer_that_would_train_alone(session):
    trainer = transformers.Trainer.__new__(transformers.Trainer)
    trainer.args = types.SimpleNamespace(world_size=1)
    with pytest.raises(ValueError, match=r"sees a world of 1 process\(es\) but the group has 2: make TrainingArg"):
        hf.prepare_trainer(trainer)


def test_prepare_trainer_keeps_the_trainers_own_class_below_and_pickles(session):
    import pickle

    class MyTrainer(transformers.Trainer):
        pass

    plain, mine = (cls.__new__(cls) for cls in (transformers.Trainer, MyTrainer))
    for trainer in (plain, mine):
        trainer.args = types.SimpleNamespace(world_size=2)
        assert hf.prepare_trainer(trainer) is trainer and hf.prepare_trainer(trainer) is trainer
    assert type(plain) is hf.RayTransformersTrainer
    assert type(mine).__mro__[1:3] == (hf.BatchIterables, MyTrainer)
    assert pickle.loads(pickle.dumps(hf.RayTransformersTrainer)) is hf.RayTransformersTrainer


def test_without_transformers_the_module_names_the_pip_install(monkeypatch):
    import importlib

    monkeypatch.setitem(sys.modules, "transformers", None)  # import transformers now raises ImportError
    for name in ("raytrain_nb.huggingface.transformers", "raytrain_nb._internal.frameworks.transformers_utils"):
        monkeypatch.delitem(sys.modules, name, raising=False)  # imported afresh; monkeypatch puts them back
    with pytest.raises(ImportError) as info:
        importlib.import_module("raytrain_nb.huggingface.transformers")
    assert str(info.value) == "transformers is not installed: pip install 'raytrain_nb[transformers]'"


class _Borg:
    def __init__(self):
        self._shared_state = {}


def _fake_accelerate(monkeypatch, kind):
    partial, acc = _Borg(), _Borg()
    cleared = []

    def _reset_state(reset_partial_state=False):
        acc._shared_state.clear()
        if reset_partial_state:
            partial._shared_state.clear()
        cleared.append(reset_partial_state)

    acc._reset_state = _reset_state
    module = types.SimpleNamespace(PartialState=partial, AcceleratorState=acc)
    monkeypatch.setitem(sys.modules, "accelerate.state", module)
    for borg in (partial, acc):
        borg._shared_state.update(distributed_type=kind, num_processes=2, process_index=1, local_process_index=1,
                                  device="cpu")
    return partial, acc, cleared


def test_accelerate_state_takes_the_new_rank_and_size_in_place(monkeypatch):
    partial, acc, cleared = _fake_accelerate(monkeypatch, types.SimpleNamespace(value="MULTI_CPU"))
    held = partial._shared_state  # what every PartialState instance (and TrainingArguments) holds
    done = library_state.reset_library_state(TrainContext(0, 3, 0, 3, 0))
    assert "accelerate.state" in done and not cleared
    for state in (held, acc._shared_state):
        assert (state["num_processes"], state["process_index"], state["local_process_index"]) == (3, 0, 0)
        assert state["device"] == "cpu"


def test_a_state_made_without_the_group_is_cleared_for_the_next_accelerator(monkeypatch):
    partial, acc, cleared = _fake_accelerate(monkeypatch, types.SimpleNamespace(value="NO"))
    library_state.reset_library_state(TrainContext(0, 3, 0, 3, 0))
    assert cleared == [True] and partial._shared_state == {} and acc._shared_state == {}


def test_lightnings_rank_zero_rank_follows_the_worker(monkeypatch):
    def rank_zero_only():
        pass

    rank_zero_only.rank = 1
    monkeypatch.setitem(sys.modules, "lightning_utilities.core.rank_zero",
                        types.SimpleNamespace(rank_zero_only=rank_zero_only))
    library_state.reset_library_state(TrainContext(0, 1, 0, 1, 0))
    assert rank_zero_only.rank == 0


def test_a_failing_reset_does_not_stop_the_others(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "accelerate.state", types.SimpleNamespace())  # no PartialState: it raises
    monkeypatch.setitem(library_state.RESETS, "json", lambda ctx: None)
    assert library_state.reset_library_state(TrainContext(0, 1, 0, 1, 0))[-1] == "json"
    assert "could not reset accelerate.state" in caplog.text


def test_a_cpu_worker_tells_accelerate_to_use_the_cpu_group():
    assert library_state.library_env("gloo", cuda=False) == {"ACCELERATE_USE_CPU": "true",
                                                             "ACCELERATE_TORCH_DEVICE": "cpu"}
    assert library_state.library_env("nccl", cuda=True) == {"ACCELERATE_TORCH_DEVICE": "cuda:0"}
    assert library_state.library_env("none", cuda=False) == {}
