"""fit()'s errors as in Ray Train V2, and how each rank's exception reaches them (no Ray processes)."""
from __future__ import annotations

import pickle
import sys
import types

import pytest

import raytrain_nb
from raytrain_nb._internal.errors import RankFailure, WorkerDiedError, WorkerError, failure_from_exception
from raytrain_nb._internal.train import failures as fit_errors
from raytrain_nb._internal.train.failures import (ControllerError, NCCLHangError, PreemptionError,
                                                  TrainingFailedError, WorkerGroupError)
from raytrain_nb._internal.train.result import Result
from raytrain_nb._internal.train.train_loop import load_return_value, run_loop
from raytrain_nb._internal.worker import session
from raytrain_nb._internal.worker.outcome import MAX_PICKLED_EXCEPTION, pickle_exception


class TwoArgs(Exception):
    """An exception whose args do not fit its __init__: it pickles but does not unpickle."""

    def __init__(self, a, b):
        super().__init__(f"{a}-{b}")


def _raised(exc):
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001
        return caught


def _failure(rank, exc, tb="Traceback (most recent call last):\n  File \"train.py\", line 3, in f\nValueError: x",
             collateral=False):
    record = failure_from_exception(rank, exc, tb, node="n1", pickled=pickle_exception(exc))
    record.collateral = collateral
    return record


def test_the_hierarchy_and_the_public_names_are_ray_train_v2s():
    assert issubclass(WorkerGroupError, TrainingFailedError) and issubclass(ControllerError, TrainingFailedError)
    assert issubclass(NCCLHangError, WorkerGroupError) and issubclass(PreemptionError, TrainingFailedError)
    assert not issubclass(ControllerError, WorkerGroupError)
    for name in ("TrainingFailedError", "WorkerGroupError", "ControllerError", "NCCLHangError", "PreemptionError"):
        assert getattr(raytrain_nb, name) is getattr(fit_errors, name)


def test_a_ranks_own_exception_travels_typed_with_its_traceback_as_a_note():
    record = _failure(1, _raised(ValueError("bad lr")))
    assert record.pickled  # pickled on the worker
    back = pickle.loads(pickle.dumps(record))  # as the CellOutcome travels to the driver
    exc = back.exception()
    assert type(exc) is ValueError and exc.args == ("bad lr",)
    if sys.version_info >= (3, 11):
        assert exc.__notes__ == ["(raised on rank 1 on node n1)\n" + record.traceback]


def test_what_cannot_travel_is_its_record_and_a_lost_worker_its_typed_death():
    assert pickle_exception(TwoArgs(1, 2)) == b""  # pickles, but would not unpickle on the driver
    stand_in = _failure(0, TwoArgs(1, 2)).exception()
    assert isinstance(stand_in, WorkerError) and str(stand_in) == "[rank 0] TwoArgs: 1-2"
    huge = ValueError("x" * (MAX_PICKLED_EXCEPTION + 1))
    assert pickle_exception(huge) == b""
    died = WorkerDiedError(2, "killed by signal 9", pid=7, node="n2")
    assert RankFailure.of_lost(died).exception() is died
    # a class the driver cannot import: the record stands in, no error
    garbled = RankFailure(3, "Gone", "m", pickled=b"\x80\x04\x95garbage")
    assert isinstance(garbled.exception(), WorkerError)


def test_a_worker_errors_exceptions_are_the_ranks_shown_collateral_ones_only_alone():
    primary = _failure(1, _raised(ZeroDivisionError("division by zero")))
    collateral = _failure(0, RuntimeError("Connection closed by peer"), collateral=True)
    assert sorted(WorkerError([collateral, primary]).exceptions) == [1]
    only = WorkerError([collateral]).exceptions
    assert list(only) == [0] and type(only[0]) is RuntimeError


def test_worker_group_error_has_v2s_message_and_attributes_and_pickles_with_what_it_holds():
    failures = {1: ValueError("boom"), 0: WorkerDiedError(0, "killed")}
    error = WorkerGroupError("rank 1 failed\n\n[rank 1]\nValueError: boom", failures)
    assert str(error) == "Training failed due to worker errors:\nrank 1 failed\n\n[rank 1]\nValueError: boom"
    assert error.worker_failures == failures and error.error is None and error.failures == 0
    error.error, error.failures = WorkerError([RankFailure(1, "ValueError", "boom")]), 2
    error.result = Result(metrics={"step": 3}, checkpoint=None, error=error, path="/runs/a")
    back = pickle.loads(pickle.dumps(error))
    assert type(back) is WorkerGroupError and str(back) == str(error) and back.failures == 2
    assert type(back.worker_failures[1]) is ValueError and back.worker_failures[0].rank == 0
    assert back.result.error is back and back.result.metrics == {"step": 3}  # the cycle survives
    assert back.error.failures[0].message == "boom"
    assert error._render_traceback_() == str(error).splitlines()


def test_controller_and_preemption_errors_say_why_and_pickle():
    cause = _raised(raytrain_nb.ResourceError("2 workers x 1000 CPU = 2000 CPU asked, but the cluster has 8 CPU"))
    error = ControllerError(cause, "fit() could not start its workers")
    assert str(error) == ("Training failed due to controller error:\nfit() could not start its workers: "
                          "2 workers x 1000 CPU = 2000 CPU asked, but the cluster has 8 CPU")
    assert error.controller_failure is cause and error.__traceback__ is cause.__traceback__
    back = pickle.loads(pickle.dumps(error))
    assert str(back) == str(error) and type(back.controller_failure) is raytrain_nb.ResourceError
    assert str(ControllerError(ValueError("v"))) == "Training failed due to controller error:\nv"
    info = types.SimpleNamespace(preempted_ranks=[1, 3])
    pre = PreemptionError(info, drain_timed_out=True)
    assert str(pre) == "Training was interrupted by node preemption (preempted_ranks=[1, 3], drain_timed_out=True)."
    assert pickle.loads(pickle.dumps(pre)).preemption_info == info


@pytest.fixture
def rank():
    """Sets the calling process's session to the given rank, as a worker's; restores the old one."""
    before = session.current_session()

    def be(r):
        session.set_session(session.WorkerSession(session.TrainContext(r, 2, r, 2, 0)))

    yield be
    session.set_session(before)


def test_rank_zero_returns_its_value_pickled_the_others_nothing(rank):
    rank(0)
    payload = run_loop(lambda config: {"lr": config["lr"]}, {"lr": 0.1}, True, None)
    assert load_return_value(payload) == {"lr": 0.1}
    assert run_loop(lambda: None, None, False, None) is None
    rank(1)
    assert run_loop(lambda: {"big": 1}, None, False, None) is None  # only rank 0's goes to the driver


def test_an_unpicklable_return_value_is_named_on_the_worker_and_a_missing_class_on_the_driver(rank, caplog):
    import threading

    rank(0)
    with pytest.raises(TypeError, match=r"^the training function returned a lock that cannot be pickled \(.*\): "
                                         r"return something picklable, or None \(rank 0's return value"):
        run_loop(threading.Lock, None, False, None)
    assert load_return_value(b"\x80\x04\x95garbage") is None
    assert "Result.return_value is None: rank 0's return value cannot be unpickled here" in caplog.text


def test_a_recovery_that_fails_ends_the_run_with_a_controller_error_holding_the_workers_error(tmp_path, monkeypatch):
    from raytrain_nb import RunConfig, ScalingConfig
    from raytrain_nb._internal.errors import ResourceError
    from raytrain_nb._internal.train import elastic
    from raytrain_nb._internal.train.fit_run import FitRun

    trainer = types.SimpleNamespace(scaling_config=ScalingConfig(num_workers=2), run_config=RunConfig(),
                                    name="r", fresh_processes="")
    run = FitRun(trainer)
    run.group = types.SimpleNamespace(run_storage=types.SimpleNamespace(url=str(tmp_path), manager=None),
                                      num_workers=2)
    lost = RuntimeError("rank(s) 1 died and their place did not come back")

    def decide(group, exc, scaling):
        raise ResourceError(str(lost))

    monkeypatch.setattr(elastic, "decide", decide)
    died = WorkerError([RankFailure.of_lost(WorkerDiedError(1, "killed"))])
    with pytest.raises(ControllerError) as info:
        run._recover(died, None, "restart 1/3", failures=1)
    error = info.value
    assert str(error) == ("Training failed due to controller error:\nfit() could not recover after a failure: "
                          "rank(s) 1 died and their place did not come back")
    assert type(error.controller_failure) is ResourceError and error.error is died and error.failures == 1
    assert error.result.error is error and error.result.path == str(tmp_path)
