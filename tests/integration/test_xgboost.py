"""XGBoost: Ray Train's XGBoostTrainer example runs after changing only its imports (with a worker killed
mid-training and the run resumed from the newest checkpoint), and a ``backend="xgboost"`` group trains one
model over every rank's shard in cells, snapshots and rolls boosters back, and survives a rank that raises or
dies inside XGBoost's collective."""
from __future__ import annotations

import os
import re
import runpy
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..groups import quiet
from .test_examples import port

xgboost = pytest.importorskip("xgboost")

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "xgboost_trainer.py"

SETUP = """
import os, signal, numpy as np, xgboost, raytrain_nb as train
rank = train.get_context().get_world_rank()
x = np.random.default_rng(rank).normal(size=(200, 4))  # each rank its own shard
y = x @ np.array([1.0, -2.0, 0.5, 3.0])
params = {"tree_method": "hist", "max_depth": 3, "eta": 0.3}

class Fail(xgboost.callback.TrainingCallback):
    def __init__(self, how): self.how = how
    def after_iteration(self, model, epoch, log):
        if rank == 1 and epoch == 1:
            if self.how == "raise": raise RuntimeError("rank 1 fails inside xgboost.train")
            os.kill(os.getpid(), signal.SIGKILL)
        return False
"""
# The DMatrix is built in the cell that trains: XGBoost caches a DMatrix's histogram cuts, agreed over the ranks
# that built it, so a rank new after a restart must not meet its peers' cached ones.
TRAIN = """
dtrain = xgboost.DMatrix(x, label=y)
bst = xgboost.train(params, dtrain, num_boost_round=3)
(xgboost.collective.get_world_size(), xgboost.collective.get_rank(), bst.num_boosted_rounds())
"""


@pytest.fixture(scope="module")
def xgb_group(ray_session):
    from raytrain_nb import WorkerGroup

    group = WorkerGroup(2, backend="xgboost")
    try:
        quiet(group, SETUP)
        yield group
    finally:
        group.shutdown()


def _models(group):
    return [bytes(b.save_raw("ubj")) for b in group.pull("bst", rank=None)]


@pytest.mark.scripts
def test_example_runs_after_the_import_change_and_resumes_from_the_newest_checkpoint(ray_session, tmp_path, capsys):
    source = EXAMPLE.read_text()
    ported = port(source)
    changed = [(a, b) for a, b in zip(source.splitlines(), ported.splitlines()) if a != b]
    assert len(changed) == 3 and all(a.startswith(("import ray.train", "from ray.train")) and
                                     b.startswith(("import raytrain_nb", "from raytrain_nb")) for a, b in changed)
    assert "ray.train" not in ported.split('"""', 2)[2]
    path = tmp_path / EXAMPLE.name
    path.write_text(ported)
    runpy.run_path(str(path), run_name="__main__")  # asserts the booster's rounds and where it resumed
    out = capsys.readouterr()
    assert "XGBOOST OK" in out.out, out.out[-3000:]
    assert "restart 1/1" in out.err and "rank(s) 1 died" in out.err, out.err[-3000:]
    assert re.search(r"final metrics: \{'train-rmse': [\d.]+, 'start_round': 4\}", out.out)


def test_a_cell_trains_one_model_over_every_ranks_shard(xgb_group):
    result = quiet(xgb_group, TRAIN)
    assert [v[0]["text/plain"] for v in result.values.values()] == ["(2, 0, 3)", "(2, 1, 3)"]
    first, second = _models(xgb_group)
    assert first == second  # the shards differ: equal models mean one model trained over both


def test_boosters_snapshot_and_roll_back_into_the_same_object(xgb_group):
    quiet(xgb_group, TRAIN)
    saved = _models(xgb_group)[0]
    xgb_group.checkpoint("three_rounds")
    quiet(xgb_group, "bst_id = id(bst)\nbst = xgboost.train(params, dtrain, num_boost_round=2, xgb_model=bst)\n"
                     "same = bst")
    assert [b.num_boosted_rounds() for b in xgb_group.pull("bst", rank=None)] == [5, 5]
    restored = xgb_group.rollback("three_rounds")
    assert "bst" in restored.restored
    assert _models(xgb_group) == [saved, saved]
    assert quiet(xgb_group, "same is bst and same.num_boosted_rounds()").values[0][0]["text/plain"] == "3"


def test_a_rank_that_raises_inside_the_collective_ends_the_cell_on_every_rank(xgb_group):
    from raytrain_nb import WorkerError

    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        quiet(xgb_group, "xgboost.train(params, dtrain, num_boost_round=5, callbacks=[Fail('raise')])")
    assert time.monotonic() - started < 60
    assert "rank 1 fails inside xgboost.train" in str(info.value)
    assert info.value.ranks == [0, 1]
    assert "stopped by raytrain_nb" not in str(info.value)  # rank 0 failed in the collective, not stopped
    assert quiet(xgb_group, TRAIN).values[1][0]["text/plain"] == "(2, 1, 3)"  # the next cell trains again


def test_a_rank_killed_inside_the_collective_is_named_and_restart_recovers(xgb_group):
    from raytrain_nb import WorkerError

    # A cell that grew a booster is a training cell, which new ranks do not replay: they lack what it made.
    quiet(xgb_group, "trained_on = xgboost.DMatrix(x, label=y)\n"
                     "bst = xgboost.train(params, trained_on, num_boost_round=3)\n"
                     "rounds_done = bst.num_boosted_rounds()")
    trained = _models(xgb_group)[0]
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        quiet(xgb_group, "xgboost.train(params, trained_on, num_boost_round=5, callbacks=[Fail('kill')])")
    assert time.monotonic() - started < 60
    assert "the worker process of rank 1" in str(info.value)
    xgb_group.take_replay_failures()  # this test looks at what the restart adds
    assert xgb_group.restart() == [1]
    # The new rank 1 has rank 0's booster and variables (no torch process group carried them: the driver did);
    # its DMatrix would be rank 0's data, so it is named, not copied.
    assert _models(xgb_group) == [trained, trained]
    assert xgb_group.pull("rounds_done", rank=None) == [3, 3]
    assert [line for line in xgb_group.replay_failures if "'trained_on'" in line] == [
        "rank(s) 1: 'trained_on' is rank 0's XGBoost DMatrix (its own data), not copied: build it again in the cell "
        "that trains"]
    more = quiet(xgb_group, "dtrain = xgboost.DMatrix(x, label=y)\n"
                            "bst = xgboost.train(params, dtrain, num_boost_round=2, xgb_model=bst)\n"
                            "bst.num_boosted_rounds()")
    assert [v[0]["text/plain"] for v in more.values.values()] == ["5", "5"]  # training goes on from round 3
    result = quiet(xgb_group, TRAIN)
    assert [v[0]["text/plain"] for v in result.values.values()] == ["(2, 0, 3)", "(2, 1, 3)"]
    first, second = _models(xgb_group)
    assert first == second


def test_configs_and_legacy_arguments_are_refused_in_one_line():
    from raytrain_nb import ConfigError
    from raytrain_nb.xgboost import XGBoostConfig, XGBoostTrainer

    with pytest.raises(ConfigError, match=r"^XGBoostConfig\(xgboost_communicator='nccl'\): only 'rabit'"):
        XGBoostConfig(xgboost_communicator="nccl")
    with pytest.raises(DeprecationWarning, match="legacy API"):
        XGBoostTrainer(lambda: None, label_column="y")
    assert XGBoostTrainer(lambda: None).backend == "xgboost"


def test_a_missing_xgboost_is_named_with_its_pip_install():
    code = "import sys; sys.modules['xgboost'] = None\nimport raytrain_nb.xgboost"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == \
        "ImportError: xgboost is not installed: pip install 'raytrain_nb[xgboost]'"


def test_local_mode_boosts_in_this_process_without_the_collective():
    import numpy as np

    from raytrain_nb import ScalingConfig
    from raytrain_nb.xgboost import RayTrainReportCallback, XGBoostTrainer

    def train_fn():  # no tracker, no communicator: plain xgboost.train, as under Ray Train's local mode
        x = np.random.default_rng(0).normal(size=(100, 3))
        dtrain = xgboost.DMatrix(x, label=x.sum(axis=1))
        booster = xgboost.train({"max_depth": 2}, dtrain, num_boost_round=3, evals=[(dtrain, "train")],
                                verbose_eval=False, callbacks=[RayTrainReportCallback()])
        return booster.num_boosted_rounds()

    result = XGBoostTrainer(train_fn, scaling_config=ScalingConfig(num_workers=0)).fit()
    assert result.return_value == 3 and result.path is None and "train-rmse" in result.metrics
    assert RayTrainReportCallback.get_model(result.checkpoint).num_boosted_rounds() == 3  # its copy outlives report()
