"""What a new rank of a group without a torch process group (XGBoost, LightGBM, ``backend="none"``) gets from
a live peer through the driver: the boosters and variables it lacks, a replayed booster loaded in place, its own
data left alone, data handles named and never copied, and no torch import on the way."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading

import numpy as np
import pytest

from raytrain_nb._internal.worker import peer_copy
from raytrain_nb._internal.worker.replicate import plan_transfer

xgboost = pytest.importorskip("xgboost")


def _booster(rounds: int, seed: int = 0):
    x = np.random.default_rng(seed).normal(size=(50, 3))
    return xgboost.train({"max_depth": 2}, xgboost.DMatrix(x, label=x.sum(axis=1)), num_boost_round=rounds)


def _plan(src_ns, new_ns, rank_specific=("rank",)):
    stock = [peer_copy.inventory(src_ns, False), peer_copy.inventory(new_ns, True)]
    send, keep, cannot = plan_transfer(stock, 0, list(rank_specific))
    return stock, send, keep, cannot


def test_a_new_rank_gets_the_boosters_and_variables_it_lacks_and_keeps_its_own_data():
    src = {"rank": 0, "x": np.zeros(3), "bst": _booster(4), "epochs_done": 4, "models": {"a": _booster(2)}}
    new = {"rank": 1, "x": np.ones(3)}
    stock, send, keep, cannot = _plan(src, new)
    assert send == ["bst", "epochs_done", "models"] and "x" in keep and cannot == []
    packed = peer_copy.pack(src, send, keep, ["epochs_done"], [], {})
    assert not packed["problems"]
    received = peer_copy.receive(new, packed, keep, {}, deferred_ddp=None)
    assert received == ["bst", "epochs_done", "models"]
    assert bytes(new["bst"].save_raw("ubj")) == bytes(src["bst"].save_raw("ubj"))
    assert new["models"]["a"].num_boosted_rounds() == 2 and new["epochs_done"] == 4
    assert new["rank"] == 1 and new["x"].tolist() == [1.0, 1.0, 1.0]  # its own shard and rank stay


def test_a_booster_the_new_rank_rebuilt_gets_the_source_model_in_the_same_object():
    src, new = {"bst": _booster(5)}, {"bst": _booster(1, seed=3)}
    mine = new["bst"]
    stock, send, keep, _ = _plan(src, new)
    assert send == [] and keep == ["bst"] and stock[0]["boosters"] == stock[1]["boosters"] == ["bst"]
    received = peer_copy.receive(new, peer_copy.pack(src, send, keep, [], ["bst"], {}), keep, {}, None)
    assert received == ["bst"] and new["bst"] is mine and mine.num_boosted_rounds() == 5


def test_data_handles_are_named_not_copied_and_what_cannot_be_pickled_is_named():
    x = np.ones((4, 2))
    handles = {"d": xgboost.DMatrix(x), "q": xgboost.QuantileDMatrix(x)}
    assert peer_copy.inventory(handles, False)["handles"] == {"d": "XGBoost DMatrix", "q": "XGBoost DMatrix"}
    assert peer_copy.data_handle(xgboost.DMatrix) == "" and peer_copy.data_handle(x) == ""
    lgb = pytest.importorskip("lightgbm")
    assert peer_copy.data_handle(lgb.Dataset(x, label=np.ones(4))) == "LightGBM Dataset"
    packed = peer_copy.pack({"lock": threading.Lock()}, ["lock"], [], [], [], {})
    assert packed["payload"] == b"" and "lock" in packed["problems"]


def test_a_boosting_rank_does_not_import_torch_to_take_stock_pack_or_receive():
    probe = textwrap.dedent("""
        import json, sys
        import numpy as np, xgboost
        from raytrain_nb._internal.worker import peer_copy
        x = np.ones((20, 2))
        src = {"bst": xgboost.train({}, xgboost.DMatrix(x, label=x[:, 0]), 2), "n": 2}
        stock = peer_copy.inventory(src, False)
        new = {}
        got = peer_copy.receive(new, peer_copy.pack(src, ["bst"], [], ["n"], [], {}), [], {}, None)
        print(json.dumps({"got": got, "torch": "torch" in sys.modules, "boosters": stock["boosters"]}))
    """)
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {"got": ["bst", "n"], "torch": False, "boosters": ["bst"]}
