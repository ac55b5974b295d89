"""The pure parts of the XGBoost / LightGBM support: which metrics the callbacks report, boosters' model bytes
loaded back into the same object, and how a framework backend name shapes a group's and a trainer's config."""
from __future__ import annotations

import numpy as np
import pytest

from raytrain_nb._internal.frameworks.boosting_report import ReportOptions, flatten
from raytrain_nb._internal.group.config import GroupConfig
from raytrain_nb._internal.worker import boosters, framework
from raytrain_nb._internal.worker.snapshot import capture, restore


def test_report_options_pick_rename_and_postprocess_metrics():
    results = flatten({"train": {"rmse": 1.0}, "eval": {"rmse": 2.0, "mae": 3.0}})
    assert results == {"train-rmse": 1.0, "eval-rmse": 2.0, "eval-mae": 3.0}
    assert ReportOptions().report_dict(results) == results
    assert ReportOptions("eval-mae").report_dict(results) == {"eval-mae": 3.0}
    assert ReportOptions({"loss": "eval-rmse"}, results_postprocessing_fn=lambda m: {**m, "x": 1}) \
        .report_dict(results) == {"loss": 2.0, "x": 1}
    with pytest.raises(KeyError, match="metric 'eval-auc' is not among the results"):
        ReportOptions(["eval-auc"]).report_dict(results)
    with pytest.raises(ValueError, match=r"RayTrainReportCallback\(frequency=-1\)"):
        ReportOptions(frequency=-1)


@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_a_booster_snapshot_loads_back_into_the_same_object(library):
    lib = pytest.importorskip(library)
    x = np.random.default_rng(0).normal(size=(100, 3))
    y = x.sum(axis=1)
    if library == "xgboost":
        train = lambda rounds, init=None: lib.train({"max_depth": 2}, lib.DMatrix(x, label=y), rounds, xgb_model=init)
        rounds = lambda b: b.num_boosted_rounds()
    else:
        train = lambda rounds, init=None: lib.train({"verbose": -1, "min_data_in_leaf": 5}, lib.Dataset(x, label=y),
                                                    rounds, init_model=init)
        rounds = lambda b: b.current_iteration()
    bst = train(2)
    assert boosters.is_booster(bst) and not boosters.is_booster(type(bst))
    namespace = {"bst": bst, "models": {"a": bst}}
    replicated, own, variables = capture(namespace)
    assert list(replicated["boosters"]) == ["bst"] and isinstance(replicated["boosters"]["bst"], bytes)
    before = bst.predict(lib.DMatrix(x) if library == "xgboost" else x)
    namespace["bst"] = later = train(3, bst)  # a new object under the name, as continued training gives
    assert rounds(later) == 5
    assert restore(namespace, replicated, None) == ["bst"]
    assert namespace["bst"] is later and rounds(later) == 2  # loaded in place
    np.testing.assert_allclose(later.predict(lib.DMatrix(x) if library == "xgboost" else x), before)


def test_a_framework_backend_name_means_no_torch_process_group():
    assert {"xgboost", "lightgbm"} <= set(framework.names())
    config = GroupConfig(num_workers=2, backend="xgboost")
    assert config.framework == "xgboost" and config.resolved_backend == "none"
    assert GroupConfig(backend="gloo").framework is None
    with pytest.raises(Exception, match=r"backend='jax' is unknown: use one of gloo, nccl, none, xgboost"):
        GroupConfig(backend="jax")


def test_trainers_pick_their_framework_backend():
    from raytrain_nb.lightgbm import LightGBMConfig, LightGBMTrainer
    from raytrain_nb.xgboost import XGBoostConfig, XGBoostTrainer

    assert XGBoostTrainer(lambda: None, xgboost_config=XGBoostConfig()).backend == "xgboost"
    assert LightGBMTrainer(lambda config: None, lightgbm_config=LightGBMConfig()).backend == "lightgbm"
    with pytest.raises(ValueError, match=r"XGBoostTrainer\(xgboost_config=LightGBMConfig"):
        XGBoostTrainer(lambda: None, xgboost_config=LightGBMConfig())


def test_framework_checkpoints_hold_a_model_as_ray_trains_do(tmp_path):
    xgb = pytest.importorskip("xgboost")
    lgb = pytest.importorskip("lightgbm")
    from raytrain_nb.lightgbm import LightGBMCheckpoint
    from raytrain_nb.xgboost import XGBoostCheckpoint

    x, y = np.array([[1, 2], [3, 4]] * 10), np.array([0, 1] * 10)
    ckpt = XGBoostCheckpoint.from_model(xgb.XGBClassifier(n_estimators=2).fit(x, y).get_booster())
    assert isinstance(ckpt, XGBoostCheckpoint) and ckpt.get_model().num_boosted_rounds() == 2
    model = lgb.LGBMClassifier(n_estimators=2, verbose=-1, min_child_samples=1).fit(x, y).booster_
    ckpt = LightGBMCheckpoint.from_model(model, path=str(tmp_path))
    assert (tmp_path / "model.txt").exists() and ckpt.get_model().current_iteration() == 2
    with pytest.raises(ValueError, match="not a directory"):
        LightGBMCheckpoint.from_model(model, path=str(tmp_path / "model.txt"))


@pytest.mark.parametrize("library", ["xgboost", "lightgbm"])
def test_a_cell_that_grew_a_booster_trained_and_one_that_did_not_did_not(library):
    """training_steps grows with every round a named booster gained (a new one counts whole): the group then
    keeps the cell out of what new ranks replay."""
    lib = pytest.importorskip(library)
    from raytrain_nb._internal.frameworks.boosting import LIGHTGBM, XGBOOST

    backend = XGBOOST if library == "xgboost" else LIGHTGBM
    x = np.random.default_rng(0).normal(size=(100, 3))
    if library == "xgboost":
        def train(rounds, init=None):
            return lib.train({"max_depth": 2}, lib.DMatrix(x, label=x.sum(axis=1)), rounds, xgb_model=init)
    else:
        def train(rounds, init=None):
            return lib.train({"verbose": -1, "min_data_in_leaf": 5}, lib.Dataset(x, label=x.sum(axis=1)), rounds,
                             init_model=init, keep_training_booster=True)
    ns = {"x": x}
    before = backend.training_steps(ns)
    assert backend.training_steps(ns) == before  # nothing trained: a setup cell
    ns["models"] = {"a": train(3)}
    grown = backend.training_steps(ns)
    assert grown > before
    assert backend.training_steps(ns) == grown  # looking again is not training
    ns["models"]["a"] = train(2, ns["models"]["a"])
    assert backend.training_steps(ns) > grown  # more rounds, from the same model
