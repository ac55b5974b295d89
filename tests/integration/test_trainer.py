"""TorchTrainer / DataParallelTrainer on the real local Ray instance: results, resume after crashes, data."""
from __future__ import annotations

import json
import pickle

import pytest
import torch

from raytrain_nb import (CheckpointConfig, ControllerError, CSVLoggerCallback, DataParallelTrainer, FailureConfig,
                         JsonLoggerCallback, ResourceError, Result, RunConfig, ScalingConfig, TrainingFailedError,
                         UserCallback, WorkerDiedError, WorkerGroupError)
from raytrain_nb.torch import TorchTrainer

from ..groups import pickled_by_value
from . import train_loops

STEPS = 6
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def by_value(ray_session):
    """Workers get the loop functions by value (they need not import the tests package)."""
    with pickled_by_value(train_loops):
        yield


class Collect(UserCallback):
    def __init__(self):
        self.reports, self.errors, self.checkpoints = [], [], []

    def after_report(self, metrics, checkpoint):
        self.reports.append(metrics)
        self.checkpoints.append(checkpoint)

    def after_exception(self, errors):
        self.errors.append(errors)


def _fit(tmp_path, name, fail=None, max_failures=0, steps=STEPS, callbacks=None, **run):
    config = {"steps": steps, "fail": dict(fail, marker=str(tmp_path / f"{name}.marker")) if fail else None}
    trainer = TorchTrainer(train_loops.deterministic_loop, train_loop_config=config,
                           scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig(name=name, storage_path=str(tmp_path), callbacks=callbacks,
                                                failure_config=FailureConfig(max_failures=max_failures), **run))
    return trainer.fit()


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """One uninterrupted 2-worker run, with loggers and a collecting callback."""
    tmp = tmp_path_factory.mktemp("runs")
    cb = Collect()
    result = _fit(tmp, "clean", callbacks=[cb, JsonLoggerCallback(), CSVLoggerCallback()],
                  checkpoint_config=CheckpointConfig(num_to_keep=3, checkpoint_score_attribute="loss",
                                                     checkpoint_score_order="min"))
    return result, cb, tmp


def _steps(result):
    return [int(s) for s in result.metrics_dataframe["step"]]


def test_fit_matches_a_single_process_run_parameter_for_parameter(uninterrupted):
    result, _, _ = uninterrupted
    got = train_loops.checkpoint_params(result.checkpoint)
    want = train_loops.reference_params(STEPS)
    assert all(torch.allclose(g, w, atol=1e-6) for g, w in zip(got, want))


def test_result_fields_callbacks_and_loggers(uninterrupted):
    result, cb, tmp = uninterrupted
    assert result.error is None and result.path == str(tmp / "clean")
    assert result.metrics["step"] == STEPS - 1 and result.metrics["world_size"] == 2
    df = result.metrics_dataframe
    assert list(df["step"]) == list(range(STEPS)) and {"loss", "timestamp"} <= set(df.columns)
    assert result.checkpoint.path.endswith(f"checkpoint_{STEPS:06d}")
    assert len(result.best_checkpoints) == 3  # num_to_keep, best (lowest loss) first
    losses = [m["loss"] for _, m in result.best_checkpoints]
    assert losses == sorted(losses)
    assert result.get_best_checkpoint("loss", "min").path == result.best_checkpoints[0][0].path
    back = Result.from_path(result.path)
    assert back.metrics == result.metrics and back.checkpoint.path == result.checkpoint.path
    assert [len(m) for m in cb.reports] == [2] * STEPS and cb.errors == []
    assert cb.checkpoints[-1].path == result.checkpoint.path
    lines = (tmp / "clean" / "result.json").read_text().splitlines()
    assert [json.loads(l)["step"] for l in lines] == list(range(STEPS))
    csv_rows = (tmp / "clean" / "progress.csv").read_text().splitlines()
    assert csv_rows[0].split(",")[:2] == ["step", "loss"] and len(csv_rows) == STEPS + 1


@pytest.mark.parametrize("how", ["raise", "kill"])
def test_resume_after_a_crash_just_after_a_report(tmp_path, uninterrupted, how):
    cb = Collect()
    result = _fit(tmp_path, f"crash-{how}", fail={"step": 2, "rank": 1, "how": how}, max_failures=1, callbacks=[cb])
    assert _steps(result) == list(range(STEPS))  # resumed from step 2's checkpoint: no step repeated or skipped
    starts = sorted({int(s) for s in result.metrics_dataframe["start"]})
    assert starts == [0, 3]
    kind = WorkerDiedError if how == "kill" else RuntimeError
    assert len(cb.errors) == 1 and list(cb.errors[0]) == [1] and type(cb.errors[0][1]) is kind  # the exception itself
    clean = train_loops.checkpoint_params(uninterrupted[0].checkpoint)
    assert all(torch.equal(a, b) for a, b in zip(train_loops.checkpoint_params(result.checkpoint), clean))


def test_no_failures_allowed_raises_a_worker_group_error_with_each_ranks_exception(tmp_path):
    trainer = DataParallelTrainer(train_loops.raising_loop, scaling_config=ScalingConfig(num_workers=2),
                                  run_config=RunConfig(name="fails", storage_path=str(tmp_path)))
    with pytest.raises(WorkerGroupError, match=r"^Training failed due to worker errors:\nrank 0, rank 1 failed, "
                                               r"after 0 restart\(s\) \(FailureConfig\(max_failures=0\)\)") as info:
        trainer.fit()
    error = info.value
    assert isinstance(error, TrainingFailedError) and not isinstance(error, ControllerError)
    text = str(error)
    assert "ZeroDivisionError: division by zero" in text and "inner_helper" in text and "return 1 / x" in text
    # V2: rank -> the exception object, typed, with the worker's traceback as a note
    assert sorted(error.worker_failures) == [0, 1]
    assert all(type(e) is ZeroDivisionError and str(e) == "division by zero" for e in error.worker_failures.values())
    notes = "\n".join(getattr(error.worker_failures[1], "__notes__", ["inner_helper"]))
    assert "inner_helper" in notes
    assert error.result.metrics == {"step": 0} and error.result.path == str(tmp_path / "fails")
    assert error.result.error is error and error.result.return_value is None
    back = pickle.loads(pickle.dumps(error))  # with what it holds: the exceptions, the result
    assert type(back) is WorkerGroupError and str(back) == text
    assert type(back.worker_failures[0]) is ZeroDivisionError and back.result.metrics == {"step": 0}


def test_the_result_holds_rank_zeros_return_value(tmp_path):
    result = DataParallelTrainer(train_loops.returning_loop, train_loop_config={"tag": "t"},
                                 scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(name="returns", storage_path=str(tmp_path))).fit()
    assert result.return_value == {"rank": 0, "world_size": 2, "tag": "t"} and result.error is None


def test_a_run_that_cannot_place_its_workers_raises_a_controller_error_naming_why(tmp_path):
    trainer = DataParallelTrainer(train_loops.raising_loop,
                                  scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 1000}),
                                  run_config=RunConfig(name="nowhere", storage_path=str(tmp_path)))
    with pytest.raises(ControllerError, match=r"^Training failed due to controller error:\nfit\(\) could not start "
                                              r"its workers: 2 workers x 1000 CPU = 2000 CPU asked, but the cluster "
                                              r"has") as info:
        trainer.fit()
    assert isinstance(info.value, TrainingFailedError) and not isinstance(info.value, WorkerGroupError)
    assert type(info.value.controller_failure) is ResourceError and info.value.result.error is info.value


def test_same_name_resumes_from_the_runs_newest_checkpoint(uninterrupted):
    _, _, tmp = uninterrupted
    result = _fit(tmp, "clean", steps=STEPS + 2)
    df = result.metrics_dataframe
    assert list(df["step"]) == list(range(STEPS + 2))  # the first run's steps, then two more
    assert set(df["start"][STEPS:]) == {STEPS}


def test_datasets_are_split_disjoint_and_covering_and_output_is_labelled(tmp_path, capfd):
    import ray

    cb = Collect()
    trainer = DataParallelTrainer(train_loops.shard_loop, train_loop_config={"epochs": 2},
                                  scaling_config=ScalingConfig(num_workers=2),
                                  datasets={"train": ray.data.range(100)},
                                  run_config=RunConfig(storage_path=str(tmp_path), callbacks=[cb]))
    trainer.fit()
    assert len(cb.reports) == 2  # the config reached both workers: two epochs each
    for by_rank in cb.reports:
        a, b = (set(m["ids"]) for m in by_rank)
        assert not a & b and a | b == set(range(100)) and len(a) == len(b) == 50
    captured = capfd.readouterr()
    assert "[rank 0] epoch 1: 50 rows" in captured.out and "[rank 1] epoch 1: 50 rows" in captured.out
    assert "report 2: epoch=1" in captured.err and "2 workers" in captured.err
