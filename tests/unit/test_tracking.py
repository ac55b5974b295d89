"""Experiment tracking's logic without a tracking library: the background log (order, retries, named once, never
blocking, bounded), report rows and grouping, the step guard, the run directory's tracking state, the report index
that survives a new kernel. The real MLflow server and W&B files are in tests/tracking/."""
from __future__ import annotations

import json
import logging
import threading
import time

import pytest

from raytrain_nb._internal.checkpoint.metrics_log import append_metrics, last_report_index, read_metrics
from raytrain_nb._internal.checkpoint.run_storage import RunStorage
from raytrain_nb._internal.tracking import background, state
from raytrain_nb._internal.tracking.background import BackgroundLog, Rejected
from raytrain_nb._internal.tracking.reports import ReportGrouper, metric_row, plain_params
from raytrain_nb._internal.tracking.tracker import Tracker, TrackerSpec
from tests.waiting import wait_for


class FakeBackend:
    """Records calls; ``fail`` makes the next calls raise (a server down), ``gate`` holds them (a slow server)."""

    def __init__(self):
        self.calls, self.fail, self.run_id = [], 0, None
        self.gate = threading.Event()
        self.gate.set()

    def describe(self):
        return "Fake at nowhere"

    def state_key(self):
        return "fake x"

    @staticmethod
    def permanent(exc):
        return isinstance(exc, ValueError)

    def _call(self, *call):
        assert self.gate.wait(30), "the test never released the fake backend"
        if self.fail:
            self.fail -= 1
            raise ConnectionError("connection refused")
        self.calls.append(call)

    def open(self, stored, run_name, run_url):
        self._call("open", stored.get("run_id"))
        self.run_id = stored.get("run_id") or "run-1"

    def state_entry(self):
        return {"run_id": self.run_id}

    def log_metrics(self, rows):
        self._call("metrics", [step for step, _, _ in rows])

    def log_params(self, params, index):
        self._call("params", params)

    def log_checkpoint(self, index, name, url, local_path):
        self._call("checkpoint", index, name)

    def note(self, kind, index, text):
        self._call("note", kind, index, text)

    def end(self, failed):
        self._call("end", failed)


def steps_logged(backend):
    return [s for c in backend.calls if c[0] == "metrics" for s in c[1]]


@pytest.fixture
def fast_retries(monkeypatch):
    monkeypatch.setattr(background, "FIRST_RETRY_S", 0.01)
    monkeypatch.setattr(background, "MAX_RETRY_S", 0.05)


def test_metric_row_is_rank0_with_means_where_ranks_differ():
    row = metric_row([{"loss": 1.0, "step": 3, "acc": 0.5, "name": "x", "nan": float("nan"), "d": {"a": 1}},
                      {"loss": 3.0, "step": 3, "acc": 0.5, "name": "y", "nan": 1.0, "d": {"a": 2}}])
    assert row == {"loss": 1.0, "loss/mean": 2.0, "step": 3.0, "acc": 0.5, "d/a": 1.0, "d/a/mean": 1.5}
    assert plain_params({"lr": 0.1, "layers": [2, 3], "model": object(), "opt": {"name": "sgd"}}) == {
        "lr": 0.1, "layers": [2, 3], "opt/name": "sgd"}


def test_reports_go_on_in_index_order_once_complete_or_at_the_cells_end():
    out = []
    grouper = ReportGrouper(lambda: 2, lambda i, m, t, c: out.append((i, [x["v"] for x in m], c)))
    rec = lambda rank, i, **kw: {"rank": rank, "report": f"checkpoint_{i:06d}", "metrics": {"v": rank}, "time": 1.0,
                                 **kw}
    grouper.on_records([rec(0, 1), rec(0, 2, checkpoint=True)])
    assert out == []  # rank 1 has reported neither
    grouper.on_records([rec(1, 2)])  # report 2 is complete: report 1 goes on first, with what came
    assert out == [(1, [0], None), (2, [0, 1], "checkpoint_000002")]
    grouper.on_records([rec(1, 3), rec(0, 4), {"rank": 0, "metrics": {}, "seq": 9}])
    grouper.flush()  # the cell ended: 3 has no rank 0 record (not logged), 4 goes on with rank 0's alone
    assert out[2:] == [(4, [0], None)]


def test_calls_run_in_order_off_the_callers_thread_and_are_retried_and_named_once(fast_retries, caplog):
    backend = FakeBackend()
    backend.fail = 3  # the server is down for the first three attempts
    tracker = Tracker(backend, "memory://nowhere", "r")
    started = time.perf_counter()
    with caplog.at_level(logging.WARNING):
        tracker.start({"lr": 0.1})
        for i in range(1, 6):
            assert tracker.log_report(i, [{"loss": float(i)}])
        queued_s = time.perf_counter() - started
        tracker.note("rollback", "rolled back to s1")
        assert tracker.flush(10)
    assert queued_s < 0.5  # nothing waited for the server
    assert backend.calls[0] == ("open", None) and backend.calls[1] == ("params", {"lr": 0.1})
    assert steps_logged(backend) == [1, 2, 3, 4, 5]
    assert backend.calls[-1] == ("note", "rollback", 5, "rolled back to s1")
    assert caplog.text.count("cannot be reached") == 1 and "answers again" in caplog.text
    assert tracker.log.failed_calls == 3


def test_a_step_is_never_logged_twice(fast_retries):
    backend = FakeBackend()
    tracker = Tracker(backend, "memory://nowhere", "r")
    for i in (1, 2, 2, 1, 3):
        tracker.log_report(i, [{"loss": 1.0}])
    assert tracker.flush(10) and steps_logged(backend) == [1, 2, 3] and tracker.skipped == 2


def test_a_slow_server_is_named_once_in_the_callers_thread_and_costs_the_caller_nothing(monkeypatch, caplog):
    monkeypatch.setattr(background, "SLOW_S", 0.2)
    backend = FakeBackend()
    backend.gate.clear()  # every call hangs until released
    tracker = Tracker(backend, "memory://nowhere", "r")
    tracker.start()
    wait_for(lambda: tracker.log.pending and not tracker.log.healthy, 10, "the open call to hang past SLOW_S")
    with caplog.at_level(logging.WARNING):
        started = time.perf_counter()
        for i in range(1, 200):
            tracker.log_report(i, [{"loss": 1.0}])
        assert time.perf_counter() - started < 0.5
        closed = time.perf_counter()
        assert tracker.close(wait_s=5) is False  # an unhealthy destination is not waited for
        assert time.perf_counter() - closed < 0.5
    assert caplog.text.count("has not answered") == 1
    backend.gate.set()
    assert tracker.flush(10)  # the log goes on after close, in the background
    assert steps_logged(backend) == list(range(1, 200)) and backend.calls[-1] == ("end", False)


def test_a_full_queue_drops_and_says_so_once(caplog):
    log = BackgroundLog("Fake", capacity=3)
    gate = threading.Event()
    with caplog.at_level(logging.WARNING):
        results = [log.submit(gate.wait, 10) for _ in range(6)]
    assert results == [True] * 3 + [False] * 3 and log.dropped == 3
    assert caplog.text.count("newer reports are not logged") == 1
    gate.set()
    assert log.flush(10)


def test_a_refused_call_is_dropped_not_retried(caplog):
    log = BackgroundLog("Fake", permanent=lambda exc: isinstance(exc, ValueError))
    done = []

    def refuse():
        raise Rejected("bad value")

    with caplog.at_level(logging.WARNING):
        log.submit(refuse, label="metrics")
        log.submit(lambda: (_ for _ in ()).throw(ValueError("bad key")), label="metrics")
        log.submit(done.append, 1)
        assert log.flush(10)
    assert done == [1] and log.failed_calls == 0 and caplog.text.count("refused metrics") == 1


def test_the_tracked_run_id_is_kept_in_the_run_directory_and_a_damaged_file_is_ignored(tmp_path, caplog):
    run = str(tmp_path)
    backend = FakeBackend()
    tracker = Tracker(backend, run, "r")
    tracker.start()
    assert tracker.flush(10) and state.lookup(run, "fake x") == {"run_id": "run-1"}
    again = FakeBackend()
    second = Tracker(again, run, "r")  # a new kernel, a trainer made again: the same tracked run
    second.start()
    assert second.flush(10) and again.calls[0] == ("open", "run-1")
    (tmp_path / state.STATE_FILE).write_text(json.dumps({"fake x": ["not", "an", "entry"], "other": {"run_id": "k"}}))
    with caplog.at_level(logging.WARNING):
        assert state.read_state(run) == {"other": {"run_id": "k"}}
    assert "malformed" in caplog.text
    (tmp_path / state.STATE_FILE).write_text('{"fake x": {"run_id": "ru')
    with caplog.at_level(logging.WARNING):
        assert state.read_state(run) == {}


def test_the_report_index_survives_a_new_kernel_without_checkpoints(tmp_path):
    run = RunStorage(str(tmp_path), "r")
    records = [{"rank": r, "report": f"checkpoint_{i:06d}", "time": 1.0, "metrics": {"step": i}}
               for i in range(1, 8) for r in (0, 1)]
    run.on_records(records, world_size=2)  # seven reports, none with a checkpoint
    run.close()
    assert read_metrics(run.url)[-1] == {"step": 7, "_time": 1.0}  # readers never see the index
    assert last_report_index(run.url) == 7
    append_metrics(run.url, {"step": 8})  # a line without an index (written by hand) does not hide it
    assert RunStorage(str(tmp_path), "r").report_base == 8


def test_a_tracker_spec_names_the_trackers_it_knows():
    with pytest.raises(ValueError, match="use 'mlflow' or 'wandb'"):
        TrackerSpec("neptune")
