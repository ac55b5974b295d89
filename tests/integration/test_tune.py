"""Ray Tune around raytrain_nb (Ray Train 2.60's pattern): trials as runs, stops that free workers, Ctrl-C, refusals.

Checked through Ray's own tables (actors, placement groups), not through our bookkeeping.
"""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, List

import pytest
import torch

from raytrain_nb import ConfigError, Result, RunConfig, ScalingConfig
from raytrain_nb._internal.errors import ResourceError
from raytrain_nb._internal.group import placement
from raytrain_nb._internal.group.config import GroupConfig
from raytrain_nb._internal.train.trial import TuneTrial, check_beside_trial
from raytrain_nb.torch import TorchTrainer
from raytrain_nb.tune import TuneReportCallback

from ..groups import pickled_by_value
from ..waiting import wait_for
from . import tune_trials

pytestmark = pytest.mark.ray
tune = pytest.importorskip("ray.tune")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", autouse=True)
def by_value(ray_session):
    """Trial actors and workers get the trial functions by value (they need not import the tests package)."""
    with pickled_by_value(tune_trials):
        yield


def _actors() -> Dict[str, dict]:
    from ray._private.state import state

    return state.actor_table(None)


def _pg_states() -> Dict[str, str]:
    import ray

    return {pg_id: entry["state"] for pg_id, entry in ray.util.placement_group_table().items()}


class StopWatch(tune.Callback):
    """On the driver: when Tune ends each trial, and how long its placement group outlives that."""

    def __init__(self) -> None:
        self.ended: Dict[str, float] = {}
        self.pg_freed_after: Dict[str, float] = {}
        self._threads: List[threading.Thread] = []

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.ended[trial.trial_id] = time.time()
        pg = (trial.last_result or {}).get("pg")
        if pg:
            thread = threading.Thread(target=self._watch, args=(trial.trial_id, pg, time.monotonic()), daemon=True)
            thread.start()
            self._threads.append(thread)

    def _watch(self, trial_id: str, pg: str, since: float) -> None:
        try:
            wait_for(lambda: _pg_states().get(pg) == "REMOVED", 30, f"placement group {pg} REMOVED", interval=0.1)
            self.pg_freed_after[trial_id] = time.monotonic() - since
        except AssertionError:
            self.pg_freed_after[trial_id] = float("inf")

    def join(self) -> None:
        for thread in self._threads:
            thread.join(timeout=35)


@pytest.mark.scripts
@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
@pytest.mark.timeout(300)
def test_asha_stops_weak_trials_and_their_workers_at_once(tmp_path):
    from ray.tune.schedulers import ASHAScheduler

    watch = StopWatch()
    tuner = tune.Tuner(
        tune.with_resources(tune_trials.driver_fn, {"cpu": 0.1}),
        param_space={"lr": tune.grid_search([0.2, 0.1, 0.002, 0.001])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2,
                                    scheduler=ASHAScheduler(max_t=tune_trials.EPOCHS, grace_period=1,
                                                            reduction_factor=2)),
        run_config=tune.RunConfig(name="asha", storage_path=str(tmp_path / "tune"), verbose=0, callbacks=[watch]))
    results = tuner.fit()
    watch.join()
    assert not results.errors, results.errors
    iterations = {r.metrics["trial_id"]: r.metrics["training_iteration"] for r in results}
    early = [t for t, n in iterations.items() if n < tune_trials.EPOCHS]
    assert len(iterations) == 4 and early and max(iterations.values()) == tune_trials.EPOCHS, iterations

    # Every trial's workers (the actors its trial actor owns) are dead, within seconds of Tune ending the trial,
    # and its placement group is REMOVED as soon.
    actors = _actors()
    for r in results:
        trial_id = r.metrics["trial_id"]
        trial_actor = next(a for a in actors.values() if a["Pid"] == r.metrics["pid"])
        workers = [a for a in actors.values() if a["ActorClassName"] == "Worker"
                   and a["OwnerAddress"]["Port"] == trial_actor["Address"]["Port"]
                   and a["OwnerAddress"]["NodeID"] == trial_actor["Address"]["NodeID"]]
        assert len(workers) == 2, (trial_id, workers)
        for worker in workers:
            assert worker["State"] == "DEAD", (trial_id, worker)
            assert worker["EndTime"] / 1000 - watch.ended[trial_id] < 10, (trial_id, worker["EndTime"])
        assert watch.pg_freed_after[trial_id] < 10, (trial_id, watch.pg_freed_after)

    # The best trial: its config, metrics and checkpoint; its run is a normal run, named after the trial.
    best = results.get_best_result()
    assert best.config["lr"] in (0.2, 0.1) and best.metrics["training_iteration"] == tune_trials.EPOCHS
    with best.checkpoint.as_directory() as d:
        assert torch.load(os.path.join(d, "state.pt"), weights_only=True)["epoch"] == tune_trials.EPOCHS - 1
    run_path = best.metrics["checkpoint_path"].rsplit("/", 1)[0]
    assert run_path.endswith(f"asha_{best.metrics['trial_id']}"), run_path
    run = Result.from_path(run_path)
    assert len(run.metrics_dataframe) == tune_trials.EPOCHS and run.checkpoint.path == best.metrics["checkpoint_path"]


def test_the_v1_form_tuner_of_a_trainer_is_refused_at_once():
    trainer = TorchTrainer(tune_trials.train_func, scaling_config=ScalingConfig(num_workers=2))
    with pytest.raises(ConfigError, match=r"^tune\.Tuner\(TorchTrainer\(\.\.\.\)\) is Ray Train V1's form .*"
                                          r"tune\.Tuner\(driver_fn, param_space=\.\.\.\)") as info:
        tune.Tuner(trainer, param_space={"train_loop_config": {"lr": tune.grid_search([0.1, 0.01])}})
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="not supported"):
        trainer({"lr": 0.1})


def test_the_callback_belongs_in_a_trial():
    with pytest.raises(RuntimeError, match="must be used in a Tune session"):
        RunConfig(callbacks=[TuneReportCallback()])


@pytest.mark.scripts
@pytest.mark.timeout(240)
def test_ctrl_c_stops_the_sweep_its_workers_and_placement_groups(ray_session, tmp_path):
    import ray

    ours = ray.get_runtime_context().get_job_id()
    pgs_before = set(_pg_states())
    env = {**os.environ, "RAY_ADDRESS": ray.get_runtime_context().gcs_address, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-u", "-c", tune_trials.sweep_script(str(tmp_path / "tune"))],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=tmp_path)
    lines: List[str] = []
    reader = threading.Thread(target=lambda: lines.extend(iter(proc.stdout.readline, "")), daemon=True)
    reader.start()
    try:
        wait_for(lambda: len({l.split()[1] for l in lines if l.startswith("RESULT ")}) >= 2, 150,
                 "two trials of the sweep to report")
        pgs_running = set(_pg_states()) - pgs_before
        assert pgs_running
        proc.send_signal(signal.SIGINT)
        wait_for(lambda: any(l.startswith("SWEEP ENDED") for l in lines), 60, "the sweep to end after Ctrl-C")
        theirs = lambda: [a for a in _actors().values() if a["JobID"] != ours and a["ActorClassName"] == "Worker"]  # noqa: E731
        assert theirs()
        # the driver lives on (Ray's job too): whatever is gone now was stopped by the sweep itself
        wait_for(lambda: all(a["State"] == "DEAD" for a in theirs()), 15, "every worker of the sweep to be dead")
        wait_for(lambda: all(s == "REMOVED" for p, s in _pg_states().items() if p not in pgs_before), 15,
                 "every placement group of the sweep to be REMOVED")
        assert proc.poll() is None, "".join(lines[-30:])
    finally:
        proc.kill()
        proc.wait(timeout=30)
        reader.join(timeout=10)


def test_a_trial_names_its_run_and_refuses_workers_that_never_fit_beside_it():
    trial = TuneTrial("a1b2c_00003", "driver_fn_a1b2c_00003", "my sweep:1", {"CPU": 1.0})
    assert trial.run_name() == "my-sweep-1_a1b2c_00003"
    check_beside_trial(trial, {"CPU": 1.0}, 2, {"CPU": 3.0})
    with pytest.raises(ResourceError, match=r"holds 1 CPU and its 2 workers need 2 CPU, but the cluster has 2 CPU: "
                                            r"the group could never start; give the trial function fewer"):
        check_beside_trial(trial, {"CPU": 1.0}, 2, {"CPU": 2.0})


def test_without_a_deadline_a_group_waits_for_resources_and_says_so(ray_session, monkeypatch):
    from ray.util.placement_group import placement_group, remove_placement_group

    monkeypatch.setattr(placement, "UNBOUNDED_FIRST_SAY_S", 0.3)
    monkeypatch.setattr(placement, "UNBOUNDED_SAY_EVERY_S", 0.3)
    said: List[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: said.append(record.getMessage())
    placement.logger.addHandler(handler)
    # every CPU the cluster has, not what is free now: a group an earlier test is still tearing down
    # would free its CPUs later and let the reservation through without a wait
    hog = placement_group([{"CPU": ray_session.cluster_resources()["CPU"]}])
    ray_session.get(hog.ready(), timeout=60)
    box: dict = {}
    waiter = threading.Thread(target=lambda: box.update(pg=placement.reserve(GroupConfig(num_workers=2), 2, None)),
                              daemon=True)
    try:
        waiter.start()
        wait_for(lambda: len(said) >= 2, 15, "the wait to say twice what it waits for")
        assert "waiting for resources for 2 workers x (1 CPU), strategy PACK, with no deadline" in said[0], said
        assert "free now:" in said[0] and waiter.is_alive()
    finally:
        placement.logger.removeHandler(handler)
        remove_placement_group(hog)
    waiter.join(timeout=30)
    assert box["pg"] is not None, "the group's placement group came once the resources were free"
    remove_placement_group(box["pg"])
