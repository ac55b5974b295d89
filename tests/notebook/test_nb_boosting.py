"""XGBoost in ``%%distributed --backend xgboost`` cells of a real kernel.

Train one model over both ranks' shards, snapshot, train on, roll back (the booster equals the snapshot), a
rank SIGKILLed inside ``xgboost.train`` is named, ``%dist_restart`` and the next cell trains on both ranks
again. (LightGBM's cells take the same path through ``WorkerGroup.run``: tests/integration/test_lightgbm.py.)
"""
from __future__ import annotations

import pytest

from .nbkernel import START_TIMEOUT_S

pytest.importorskip("xgboost")
pytestmark = pytest.mark.notebook

XGB_SETUP = """%%distributed --workers 2 --backend xgboost
import os, signal, numpy as np, xgboost, raytrain_nb as train
rank = train.get_context().get_world_rank()
x = np.random.default_rng(rank).normal(size=(200, 4))
y = x @ np.array([1.0, -2.0, 0.5, 3.0])

class KillRank1(xgboost.callback.TrainingCallback):
    def after_iteration(self, model, epoch, log):
        if rank == 1 and epoch == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return False
"""
XGB_TRAIN = """%%distributed
bst = xgboost.train({"tree_method": "hist", "max_depth": 3}, xgboost.DMatrix(x, label=y), num_boost_round=3,
                    xgb_model=bst if "bst" in globals() and more else None)
_m = bytes(bst.save_raw("ubj"))
"""


def _pulled(kernel, name):
    return eval(kernel.ok(f"_rt.active_group().pull({name!r}, rank=None)").value)


def test_xgboost_cells_train_snapshot_roll_back_and_recover_after_a_kill(kernel):
    kernel.ok("import raytrain_nb as _rt\n_old = _rt.active_group()\nif _old is not None:\n    _old.shutdown()")
    kernel.ok(XGB_SETUP, timeout=START_TIMEOUT_S)
    kernel.ok("%%distributed\nmore = False")
    kernel.ok(XGB_TRAIN)
    snap = _pulled(kernel, "_m")
    assert snap[0] == snap[1]  # one model over both ranks' shards
    kernel.ok("%dist_checkpoint --name three")
    kernel.ok("%%distributed\nmore = True")
    kernel.ok(XGB_TRAIN)
    assert _pulled(kernel, "_m")[0] != snap[0]
    kernel.ok("%dist_rollback three")
    kernel.ok("%%distributed\n_m = bytes(bst.save_raw('ubj'))")
    assert _pulled(kernel, "_m") == snap
    cell = kernel.run("%%distributed\nxgboost.train({}, xgboost.DMatrix(x, label=y), 5, callbacks=[KillRank1()])",
                      timeout=90)
    assert cell.status == "error" and "rank 1" in cell.error_text and "died" in cell.error_text, cell.error_text
    kernel.ok("%dist_restart", timeout=120)
    kernel.ok("%%distributed\nmore = False")
    kernel.ok(XGB_TRAIN)
    after = _pulled(kernel, "_m")
    assert after[0] == after[1] == snap[0]  # the same data and rounds: the same model as before the kill
    kernel.ok("%dist_shutdown")
