"""One tracked run per run, with steps that never repeat, through kills, restarts, rollbacks, a trainer made again
and a new group on the same run: against a real MLflow server (read back with ``MlflowClient``) and W&B in offline
mode (read back from its ``.wandb`` files)."""
from __future__ import annotations

import logging
import os
import time

import pytest

from raytrain_nb import FailureConfig, RunConfig, ScalingConfig, UserCallback, WorkerGroup
from raytrain_nb._internal.checkpoint.reported import report_index
from raytrain_nb._internal.group.group import active_group
from raytrain_nb._internal.tracking import background
from raytrain_nb.torch import TorchTrainer
from tests.groups import SETUP, pickled_by_value, quiet
from tests.waiting import wait_for

from . import loops
from .wandb_files import read_segments

pytestmark = pytest.mark.ray
STEPS = 6

#: ``n`` training steps, each reported; rank 1 kills its own process after its report of step 2 once (the marker).
CELL = """
import os, signal
for i in range(n):
    loss = model(torch.randn(8, 10)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    train.report({"step": i, "loss": loss.item() + rank})
    if i == 2 and rank == 1 and not os.path.exists(marker):
        open(marker, "w").close()
        os.kill(os.getpid(), signal.SIGKILL)
"""


@pytest.fixture(scope="module", autouse=True)
def by_value(ray_session):
    """Workers get the loop functions by value (they need not import the tests package)."""
    with pickled_by_value(loops):
        yield


class Indices(UserCallback):
    """The reference: every report ``fit()`` handed its callbacks, its index and rank 0's ``step``."""

    def __init__(self):
        self.indices, self.steps = [], []

    def after_report(self, run_context, metrics, checkpoint):
        self.indices.append(run_context.report_index)
        self.steps.append(metrics[0]["step"])


# -- reading back what each tracker holds -----------------------------------------------------------------


def read_mlflow(server, experiment):
    """``(run ids, steps of "loss" in order, tags, params)`` of the experiment's runs."""
    from mlflow import MlflowClient

    client = MlflowClient(server)
    runs = client.search_runs([client.get_experiment_by_name(experiment).experiment_id])
    run = runs[0]
    steps = [m.step for m in sorted(client.get_metric_history(run.info.run_id, "loss"),
                                    key=lambda m: (m.timestamp, m.step))]
    return [r.info.run_id for r in runs], steps, run.data.tags, run.data.params, client


def read_wandb(run_dir):
    """``(run ids, steps in the order the segments wrote them, tags, notes, config, artifacts)``."""
    segments = read_segments(run_dir)
    assert segments, f"no offline W&B segment under {run_dir}/wandb"
    ids = sorted({i for s in segments for i in s.run_ids})
    steps = [row["_step"] for s in segments for row in s.history if "loss" in row]
    config = {k: v for s in segments for k, v in s.config.items()}
    return ids, steps, segments[-1].tags, segments[-1].notes, config, [a for s in segments for a in s.artifacts]


def strictly_increasing(steps):
    return all(a < b for a, b in zip(steps, steps[1:]))


# -- a trainer ----------------------------------------------------------------------------------------------


def fit(tmp_path, name, callbacks, steps=STEPS, kill_at=None):
    config = {"steps": steps, "kill_at": kill_at, "marker": str(tmp_path / f"{name}.marker")}
    trainer = TorchTrainer(loops.loop, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name=name, storage_path=str(tmp_path), callbacks=callbacks,
                                                failure_config=FailureConfig(max_failures=1)))
    return trainer.fit()


def tracking_callback(kind, server, label, **options):
    if kind == "mlflow":
        from raytrain_nb.integrations.mlflow import MLflowLoggerCallback

        return MLflowLoggerCallback(server, experiment_name=label, **options)
    from raytrain_nb.integrations.wandb import WandbLoggerCallback

    return WandbLoggerCallback(project=label, **options)


@pytest.fixture(params=["mlflow", "wandb"])
def tracker_kind(request):
    """The tracker under test with its real part: the MLflow server's URL, or W&B offline."""
    if request.param == "mlflow":
        return "mlflow", request.getfixturevalue("mlflow_server")
    request.getfixturevalue("wandb_offline")
    return "wandb", None


def test_a_killed_fit_and_a_trainer_made_again_log_one_run_whose_steps_never_repeat(tmp_path, tracker_kind):
    kind, server = tracker_kind
    label = f"fit-{kind}"
    ref = Indices()
    first = tracking_callback(kind, server, label, **({"save_artifact": True} if kind == "mlflow" else {}))
    result = fit(tmp_path, label, [ref, first], kill_at=3)
    assert result.error is None and first.flush(60)
    # the attempt killed reported steps 0..2, and 3 unless rank 1's record of it died with it (its checkpoint may
    # still commit, from the ledger: then the next attempt starts at 4); a resume from an older checkpoint does a
    # user's step again, at a later index
    assert ref.steps[:3] == [0, 1, 2] and ref.steps[-1] == STEPS - 1 and set(range(STEPS)) - set(ref.steps) <= {3}
    assert strictly_increasing(ref.indices)
    second = tracking_callback(kind, server, label)
    again = fit(tmp_path, label, [ref, second], steps=STEPS + 2)  # the same RunConfig(name): resumes at STEPS
    assert again.error is None and second.flush(60)
    assert ref.steps[-2:] == [STEPS, STEPS + 1] and strictly_increasing(ref.indices)
    assert first.run_id == second.run_id
    if kind == "mlflow":
        ids, steps, tags, params, client = read_mlflow(server, label)
        assert params["steps"] == str(STEPS) and tags["param_changed.steps"].startswith(f"{STEPS + 2} (the param has {STEPS}")
        assert any(k.startswith("failure.report_") and "rank(s) 1 failed (WorkerDiedError" in v for k, v in tags.items())
        assert [k for k in tags if k.startswith("checkpoint.checkpoint_")], tags
        assert client.list_artifacts(ids[0], "checkpoints"), "save_artifact uploaded no checkpoint"
        assert client.get_run(ids[0]).info.status == "FINISHED"
    else:
        ids, steps, tags, notes, config, artifacts = read_wandb(tmp_path / label)
        assert "failure" in tags and "rank(s) 1 failed" in notes and config["steps"] in (STEPS, STEPS + 2)
        assert artifacts and all(a.startswith(f"checkpoint-{ids[0]}") for a in artifacts)
    assert ids == [first.run_id], "one tracked run for the run"
    assert steps == ref.indices, "exactly the reports fit() completed, each once, at its report index"


def test_cells_killed_restarted_rolled_back_and_a_new_group_log_one_run(tmp_path, tracker_kind):
    kind, server = tracker_kind
    label = f"cells-{kind}"
    storage = str(tmp_path)
    if kind == "mlflow":  # the magic's way: settings from the environment
        os.environ.update(MLFLOW_TRACKING_URI=server, MLFLOW_EXPERIMENT_NAME=label)
        try:
            group = start_with_magic(f"--workers 2 --name {label} --storage {storage} --track mlflow --no-dashboard")
        finally:
            del os.environ["MLFLOW_TRACKING_URI"], os.environ["MLFLOW_EXPERIMENT_NAME"]
        tracker = group.track("mlflow")  # asked again: the one attached
    else:
        group = WorkerGroup(2, name=label, storage_path=storage)
        quiet(group, SETUP)
        tracker = group.track(tracking_callback(kind, server, label))
    seen = []
    try:
        group.push(n=5, marker=str(tmp_path / "killed"), lr=0.1)
        quiet(group, CELL, on_failure="restart")  # rank 1 dies at step 2; restarted; the cell runs again
        assert os.path.exists(tmp_path / "killed") and group.last_recovery is not None
        group.checkpoint(name="s1")
        group.push(n=3)
        quiet(group, CELL)
        group.rollback("s1")
        quiet(group, CELL)
        seen += [report_index(r["report"]) for r in group.metrics_history[0]]
    finally:
        group.shutdown()
    assert tracker.flush(60) and tracker.closed
    newer = WorkerGroup(2, name=label, storage_path=storage)  # a new kernel on the same run
    try:
        quiet(newer, SETUP)
        if kind == "mlflow":
            tracked = newer.track("mlflow", tracking_uri=server, experiment_name=label)
        else:
            tracked = newer.track(tracking_callback(kind, server, label))
        assert tracked is not tracker
        newer.push(n=2, marker=str(tmp_path / "killed"))
        quiet(newer, CELL)
        seen += [report_index(r["report"]) for r in newer.metrics_history[0]]
    finally:
        newer.shutdown()
    assert tracked.flush(60) and tracked.run_id == tracker.run_id
    assert strictly_increasing(seen) and len(seen) >= 5 + 3 + 3 + 2
    if kind == "mlflow":
        ids, steps, tags, params, _ = read_mlflow(server, label)
        assert params["lr"] == "0.1" and params["n"] == "5" and tags["param_changed.n"] == "2 (the param has 5)"  # the latest change
        assert any(k.startswith("rollback.report_") and "snapshot s1" in v for k, v in tags.items())
        assert any(k.startswith("recovery.report_") for k in tags)
        assert "rolled back to snapshot s1" in tags["mlflow.note.content"]
    else:
        ids, steps, tags, notes, config, _ = read_wandb(tmp_path / label)
        assert "rollback" in tags and "rolled back to snapshot s1" in notes and config["lr"] == 0.1
        assert len(read_segments(tmp_path / label)) == 2  # one segment per group, one run id
    assert ids == [tracker.run_id]
    assert steps == seen, "every report rank 0 made, each once, at its report index"


def start_with_magic(line):
    """``%%distributed <line>`` running :data:`SETUP` in an in-process IPython shell; the group it started."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.extension_manager.load_extension("raytrain_nb")
    shell.run_cell_magic("distributed", line, SETUP)
    group = active_group()
    assert group is not None and group.name in line
    return group


def test_a_stopped_server_costs_the_cells_nothing_and_is_named_once(tmp_path, monkeypatch, caplog, ray_session):
    pytest.importorskip("mlflow")
    monkeypatch.setattr(background, "SLOW_S", 1.0)
    import socket

    with socket.socket() as s:  # a port nothing listens on: a tracking server that is down
        s.bind(("127.0.0.1", 0))
        dead = f"http://127.0.0.1:{s.getsockname()[1]}"
    group = WorkerGroup(2, name="down", storage_path=str(tmp_path))
    try:
        quiet(group, SETUP)
        group.push(n=40, marker=str(tmp_path / "never"))
        open(tmp_path / "never", "w").close()
        with caplog.at_level(logging.WARNING):
            tracker = group.track("mlflow", tracking_uri=dead)
            started = time.perf_counter()
            quiet(group, CELL)
            wait_for(lambda: not tracker.log.healthy, 30, "the tracker to find the server down (past SLOW_S)")
            for _ in range(2):
                quiet(group, CELL)  # their reports name the trouble, once
            tracked_s = time.perf_counter() - started
        assert tracked_s < 30, f"three 40-step cells took {tracked_s:.1f} s with the server down"
    finally:
        ended = time.perf_counter()
        group.shutdown()
        assert time.perf_counter() - ended < 30
    assert caplog.text.count(f"MLflow at {dead} has not answered") == 1, caplog.text
    assert tracker.closed and tracker.log.pending and tracker.run_id is None
