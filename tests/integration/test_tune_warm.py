"""A warm sweep: a trained group's snapshot starts every Tune trial, and the winner loads back into the group.

One story, as the tutorial tells it (docs/tune_warm.md): a 2-worker group trains a little and takes a snapshot;
a Ray Tune sweep of the fine-tuning learning rate runs our ``TorchTrainer`` in each trial, started from that
snapshot (each trial's first parameters are the snapshot's); the best trial's checkpoint loads into the group's
same ``model`` and ``opt`` on every rank (objects keep their ``id()``); the group trains on.
"""
from __future__ import annotations

import pytest
import torch

from raytrain_nb import Checkpoint, CheckpointError, GroupError
from raytrain_nb.tune import warm_start

from ..groups import SETUP, STEP, pickled_by_value, quiet, rank_params, set_up_group
from . import warm_trials

pytestmark = pytest.mark.ray

LRS = [0.001, 0.02]


@pytest.fixture(scope="module")
def group(ray_session):
    """A 2-worker group with ``model`` and ``opt`` (tests/groups.py SETUP) that has trained 3 steps."""
    with pickled_by_value(warm_trials), set_up_group(SETUP) as g:
        for _ in range(3):
            quiet(g, STEP)
        yield g


def _saved_params(checkpoint):
    """The parameters of ``model`` in a checkpoint of named state, read on the driver."""
    with checkpoint.as_directory() as d:
        state = torch.load(f"{d}/replicated.pt", weights_only=True)["modules"]["model"]
    return [state["weight"], state["bias"]]


def test_warm_sweep_then_the_winner_continues_in_the_group(group, tmp_path):
    from ray import tune

    entry = group.checkpoint("warm")
    warm = warm_start(group, "warm")
    assert warm.path == entry.checkpoint.path
    snapshot_digest = warm_trials.digest(_saved_params(warm))
    assert snapshot_digest == warm_trials.digest(rank_params(group)[0])

    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(warm_trials.trial, warm=warm, storage=str(tmp_path / "trials")),
                            {"cpu": 0.1}),
        param_space={"lr": tune.grid_search(LRS), "steps": 3},
        tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2),
        run_config=tune.RunConfig(name="warm-sweep", storage_path=str(tmp_path / "tune"), verbose=0))
    results = tuner.fit()

    assert not results.errors and len(results) == len(LRS)
    assert all(r.metrics["first"] == snapshot_digest for r in results)  # every trial started from the snapshot
    best = results.get_best_result()
    assert best.metrics["loss"] == min(r.metrics["loss"] for r in results)

    loaded = group.load(best)
    assert loaded.restored == ["model", "opt"] and str(loaded).startswith("loaded ")
    winner = _saved_params(Checkpoint(best.checkpoint.path))
    for params in rank_params(group):  # every rank holds the winner's parameters, in the same objects
        assert all(torch.equal(p, w) for p, w in zip(params, winner))
    quiet(group, "same_model = id(model) == model_id")
    assert group.pull("same_model", rank=None) == [True, True]
    lrs = group.pull("opt", rank=None)
    assert all(o.param_groups[0]["lr"] == best.config["lr"] for o in lrs)  # the winner's learning rate came too

    quiet(group, STEP)  # the group trains on from the winner
    after = rank_params(group)
    assert torch.equal(after[0][0], after[1][0]) and not torch.equal(after[0][0], winner[0])


def test_loading_what_is_not_named_state_says_what_is_wrong(group, tmp_path):
    (tmp_path / "own").mkdir()
    (tmp_path / "own" / "model.pt").write_bytes(b"x")
    with pytest.raises(CheckpointError, match=r"holds no replicated.pt or snapshot.json: it is neither a snapshot"):
        group.load(str(tmp_path / "own"))
    with pytest.raises(CheckpointError, match=r"group 'run-.*' has no snapshot named 'nope' \(it has .*warm"):
        warm_start(group, "nope")
    quiet(group, "extra = torch.nn.Linear(2, 2)")
    from raytrain_nb.tune import save_state

    save_state(str(tmp_path / "other"), model=torch.nn.Linear(10, 1), head=torch.nn.Linear(3, 3))
    with pytest.raises(GroupError, match=r"cannot load: head \(module\) do not exist in the workers' namespace"):
        group.load(str(tmp_path / "other"))
    save_state(str(tmp_path / "wide"), model=torch.nn.Linear(10, 2))
    with pytest.raises(GroupError, match=r"cannot load 'model': its structure differs .*'weight' has shape \(2, 10\)"):
        group.load(str(tmp_path / "wide"))
