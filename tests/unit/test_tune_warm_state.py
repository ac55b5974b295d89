"""State saved and loaded by variable name (``raytrain_nb.tune.save_state`` / ``load_state`` / ``warm_start``),
and the group side of it (a namespace loading ``save_state``'s checkpoint as a snapshot), without Ray."""
from __future__ import annotations

import pytest
import torch

from raytrain_nb import Checkpoint, CheckpointError, ConfigError
from raytrain_nb._internal.checkpoint.sources import as_checkpoint
from raytrain_nb._internal.errors import SnapshotError
from raytrain_nb._internal.worker import session, snapshot_io
from raytrain_nb.tune import load_state, save_state, warm_start


def _trained(out: int = 1):
    torch.manual_seed(1)
    model = torch.nn.Linear(4, out)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    return model, opt


def _fresh(out: int = 1, lr: float = 0.5):
    model = torch.nn.Linear(4, out)
    return model, torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)


def test_round_trip_by_name_loads_weights_and_momentum_into_the_same_objects(tmp_path):
    model, opt = _trained()
    ckpt = save_state(str(tmp_path), {"nets['G']": model}, opt=opt)
    assert isinstance(ckpt, Checkpoint) and sorted(p.name for p in tmp_path.iterdir()) == ["replicated.pt",
                                                                                           "snapshot.json"]
    other, other_opt = _fresh()
    weight = other.weight
    assert load_state(ckpt, {"nets['G']": other}, opt=other_opt) == ["nets['G']", "opt"]
    assert other.weight is weight and torch.equal(other.weight, model.weight)
    moms = [other_opt.state[p]["momentum_buffer"] for p in other.parameters()]
    assert all(torch.equal(a, opt.state[p]["momentum_buffer"]) for a, p in zip(moms, model.parameters()))
    assert other_opt.param_groups[0]["lr"] == 0.1  # the saved learning rate: set yours after loading


def test_a_ddp_like_wrapper_counts_as_its_module(tmp_path):
    class DistributedDataParallel(torch.nn.Module):  # what unwrap recognises, without a process group
        def __init__(self, module):
            super().__init__()
            self.module = module

    model, _ = _trained()
    save_state(str(tmp_path), model=DistributedDataParallel(model))
    saved = torch.load(tmp_path / "replicated.pt", weights_only=True)["modules"]["model"]
    assert sorted(saved) == ["bias", "weight"]  # no "module." prefix: loads into the group's unwrapped model
    target = DistributedDataParallel(torch.nn.Linear(4, 1))
    load_state(str(tmp_path), model=target)
    assert torch.equal(target.module.weight, model.weight)


def test_a_missing_name_or_a_shape_mismatch_names_it_and_loads_nothing(tmp_path):
    model, opt = _trained()
    save_state(str(tmp_path), model=model, opt=opt)
    other, other_opt = _fresh()
    before = other.weight.clone()
    with pytest.raises(CheckpointError, match=r"holds no module named 'net' \(it has model \(module\), "
                                              r"opt \(optimizer\)\); nothing was loaded"):
        load_state(str(tmp_path), model=other, net=other)
    with pytest.raises(CheckpointError, match=r"'model' does not fit .*'weight' has shape \(1, 4\) saved but "
                                              r"\(3, 4\) here"):
        load_state(str(tmp_path), opt=other_opt, model=torch.nn.Linear(4, 3))
    two_groups = torch.optim.SGD([{"params": [other.weight]}, {"params": [other.bias]}], lr=0.1)
    with pytest.raises(CheckpointError, match=r"'opt' does not fit .*groups of \[2\] parameters saved but "
                                              r"\[1, 1\] here"):
        load_state(str(tmp_path), model=other, opt=two_groups)
    assert torch.equal(other.weight, before) and not other_opt.state


def test_bad_arguments_are_one_line_errors(tmp_path):
    model, _ = _trained()
    with pytest.raises(ConfigError, match=r"lr=float is not a torch module, optimizer, LR scheduler, grad scaler or "
                                          r"XGBoost / LightGBM booster"):
        save_state(str(tmp_path), model=model, lr=0.1)
    with pytest.raises(ConfigError, match=r"no objects given: name them as in the notebook"):
        save_state(str(tmp_path))
    with pytest.raises(ConfigError, match=r"model given twice"):
        save_state(str(tmp_path), {"model": model}, model=model)
    with pytest.raises(CheckpointError, match=r"the checkpoint is None \(get_checkpoint\(\) found none\): start the "
                                              r"trainer warm"):
        load_state(None, model=model)
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "model.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"holds no replicated.pt or snapshot.json: it is neither a snapshot"):
        load_state(str(tmp_path / "own"), model=model)
    with pytest.raises(CheckpointError, match=r"holds no replicated.pt"):
        warm_start(str(tmp_path / "own"))
    with pytest.raises(ConfigError, match=r"name='warm' picks a snapshot of a group"):
        warm_start(str(tmp_path / "own"), "warm")


def test_only_rank_0_writes_inside_a_trainer(tmp_path):
    model, _ = _trained()
    session.set_session(session.WorkerSession(session.TrainContext(1, 2, 1, 2, 0)))
    try:
        assert save_state(str(tmp_path / "r1"), model=model) is None and not (tmp_path / "r1").exists()
    finally:
        session.set_session(None)


def test_what_users_hold_becomes_one_checkpoint(tmp_path):
    class Result:  # Ray Tune's Result, by duck type
        def __init__(self, checkpoint):
            self.checkpoint = checkpoint

    pafs = pytest.importorskip("pyarrow.fs")
    from ray.train import Checkpoint as RayCheckpoint

    assert as_checkpoint(str(tmp_path)).path == str(tmp_path)
    from_tune = as_checkpoint(Result(RayCheckpoint(str(tmp_path), filesystem=pafs.LocalFileSystem())))
    assert from_tune.url == str(tmp_path)  # a plain local path, as errors and results show it
    with pytest.raises(CheckpointError, match=r"group.load: Result has no checkpoint: its trial reported none"):
        as_checkpoint(Result(None), "group.load")
    with pytest.raises(CheckpointError, match=r"group.load: 3 is not a checkpoint: pass a path or URL"):
        as_checkpoint(3, "group.load")


def test_a_groups_namespace_loads_a_saved_state_like_a_snapshot(tmp_path):
    model, opt = _trained()
    save_state(str(tmp_path), model=model, opt=opt)
    target, target_opt = _fresh()
    namespace = {"model": target, "opt": target_opt, "epoch": 3}
    got = snapshot_io.load(namespace, str(tmp_path), rank=0, action="load")
    assert got == {"restored": ["model", "opt"], "changed": []}  # no fingerprints saved: nothing to compare
    assert namespace["model"] is target and torch.equal(target.weight, model.weight)
    with pytest.raises(SnapshotError, match=r"cannot load: opt \(optimizer\) do not exist in the workers' namespace; "
                                            r"create them under these names, then load again"):
        snapshot_io.load({"model": target}, str(tmp_path), rank=0, action="load")
    wide, wide_opt = _fresh(out=2)
    with pytest.raises(SnapshotError, match=r"cannot load 'model': its structure differs from the saved one"):
        snapshot_io.load({"model": wide, "opt": wide_opt}, str(tmp_path), rank=0, action="load")


@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_a_booster_is_saved_by_name_and_loads_into_the_trials_and_the_groups_same_object(tmp_path, library):
    """A warm sweep of boosters: the group's booster goes into each trial's (an empty XGBoost Booster will do),
    the trial's comes back into the group's, in place."""
    lib = pytest.importorskip(library)
    import numpy as np

    x = np.random.default_rng(0).normal(size=(100, 3))
    if library == "xgboost":
        def train(rounds):
            return lib.train({"max_depth": 2}, lib.DMatrix(x, label=x.sum(axis=1)), rounds)
    else:
        def train(rounds):
            return lib.train({"verbose": -1, "min_data_in_leaf": 5}, lib.Dataset(x, label=x.sum(axis=1)), rounds)
    trained, other = train(4), train(1)
    predict = x if library == "lightgbm" else lib.DMatrix(x)
    save_state(str(tmp_path / "warm"), bst=trained)
    target = lib.Booster() if library == "xgboost" else other
    assert load_state(str(tmp_path / "warm"), bst=target) == ["bst"]
    assert np.allclose(target.predict(predict), trained.predict(predict))
    group_bst = train(2)
    namespace = {"bst": group_bst}
    assert snapshot_io.load(namespace, str(tmp_path / "warm"), rank=0, action="load")["restored"] == ["bst"]
    assert namespace["bst"] is group_bst and np.allclose(group_bst.predict(predict), trained.predict(predict))
