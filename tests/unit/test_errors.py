import pickle

import pytest

from raytrain_nb._internal.errors import RankFailure, WorkerError, format_ranks, is_collective_failure, merge_failures


def test_identical_failures_merge_and_keep_rank_order():
    fs = [RankFailure(1, "ValueError", "bad", "tb"), RankFailure(0, "ValueError", "bad", "tb"),
          RankFailure(2, "KeyError", "'k'", "tb2")]
    merged = merge_failures(fs)
    assert [ranks for ranks, _ in merged] == [[0, 1], [2]]
    err = WorkerError(fs)
    assert str(err) == "[rank 0, 1] ValueError: bad; [rank 2] KeyError: 'k'"


def test_collateral_errors_hidden_when_a_primary_exists():
    primary = RankFailure(1, "ValueError", "boom", "Traceback...\nValueError: boom")
    collateral = RankFailure(0, "RuntimeError", "[gloo/transport/tcp] Connection closed by peer", "...",
                             collateral=True)
    err = WorkerError([primary, collateral], released=[0])
    assert err.ranks == [1]
    text = err.render()
    assert "boom" in text and "Connection closed" not in text
    assert "rank 0 released" in text


def test_only_collateral_errors_are_still_shown():
    only = RankFailure(0, "RuntimeError", "Connection reset by peer", "", collateral=True)
    assert WorkerError([only]).ranks == [0]


@pytest.mark.parametrize("type_name,message,expected", [
    ("RuntimeError", "[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Connection closed by peer", True),
    ("DistBackendError", "Connection reset by peer", True),
    ("RuntimeError", "shape mismatch", False),
    ("ValueError", "Connection reset by peer", False),
])
def test_collective_failure_classification(type_name, message, expected):
    assert is_collective_failure(type_name, message) is expected


def test_worker_error_pickles_and_renders_like_a_cell():
    err = WorkerError([RankFailure(0, "ZeroDivisionError", "division by zero",
                                   'Traceback (most recent call last):\n  File "<cell-3>", line 2\nZeroDivisionError')])
    back = pickle.loads(pickle.dumps(err))
    assert back.failures == err.failures
    lines = back._render_traceback_()
    assert lines[0] == "[rank 0]" and any("<cell-3>" in line for line in lines)


def test_long_tracebacks_are_cut_with_a_pointer():
    tb = "\n".join(f"line {i}" for i in range(500))
    text = WorkerError([RankFailure(0, "E", "m", tb)]).render()
    assert "lines cut" in text and len(text.splitlines()) < 100


def test_format_ranks():
    assert format_ranks([2, 0]) == "rank 0, 2"


def test_deaths_are_typed_group_errors_that_pickle_and_read_by_type():
    from raytrain_nb._internal.errors import (DEATHS, GroupError, WorkerDiedError, WorkerLostError,
                                              WorkerUnresponsiveError)

    died = WorkerDiedError(1, "SIGKILL", pid=42, node="10.0.0.2")
    silent = WorkerUnresponsiveError(2, "has not answered for 20 s", pid=43)
    assert str(died) == "the worker process of rank 1 (pid 42, node 10.0.0.2) died: SIGKILL"
    assert str(silent) == "the worker process of rank 2 (pid 43) stopped responding: has not answered for 20 s"
    assert "rank 1 (not started yet) died" in str(WorkerDiedError(1, "SIGKILL"))
    for err in (died, silent):
        assert isinstance(err, GroupError) and isinstance(err, WorkerLostError) and isinstance(err, DEATHS)
        back = pickle.loads(pickle.dumps(err))
        assert type(back) is type(err) and (back.rank, back.cause, back.pid, back.node) == \
            (err.rank, err.cause, err.pid, err.node)
    err = WorkerError([RankFailure.of_lost(died), RankFailure(0, "ValueError", "boom"), RankFailure.of_lost(silent)])
    assert [d.rank for d in pickle.loads(pickle.dumps(err)).deaths] == [1, 2]
    assert "Recover with %dist_restart" in err.render()
    assert not WorkerError([RankFailure(0, "WorkerDiedError", "a user's own class of that name")]).deaths
    assert "Recover with" not in WorkerError([RankFailure(0, "ValueError", "boom")]).render()
