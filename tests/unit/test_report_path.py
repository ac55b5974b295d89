"""report() on a worker, driven directly without Ray: the record queued for the driver, the ledger's
evidence written before report() returns (with the GIL kept), metrics made plain, snapshots asked for
taken at the next report."""
from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
import time

import pytest

from raytrain_nb._internal.checkpoint import reported
from raytrain_nb._internal.checkpoint.run_storage import RunStorage
from raytrain_nb._internal.worker import session as session_mod
from raytrain_nb._internal.worker.actor import Worker
from raytrain_nb._internal.worker.session import TrainContext, WorkerSession, _plain, plain_metrics

from ..waiting import wait_for

CONTEXT = {"world_rank": 1, "world_size": 2, "local_rank": 1, "local_world_size": 2, "node_rank": 0}


def make_worker(tmp_path, rank: int):
    """Rank ``rank`` of 2 with a run directory on the local disk (no process group)."""
    w = Worker(capture=False)
    w.setup(dict(CONTEXT, world_rank=rank, local_rank=rank), {}, "none", "127.0.0.1", 0)
    run = RunStorage(str(tmp_path / "runs"), f"ledger{rank}")
    w.set_storage(run.url)
    return w, run


@pytest.fixture
def worker(tmp_path):
    w, run = make_worker(tmp_path, 1)
    yield w, run
    session_mod.set_session(None)
    run.close()


def ledger_lines(run_url: str, rank: int) -> list:
    path = reported.ReportLedger(run_url, rank).path
    with open(path, "rb") as fh:
        return fh.read().split()


def test_every_report_is_in_the_ledger_when_report_returns_under_the_name_the_driver_gets(worker):
    w, run = worker
    path = reported.ReportLedger(run.url, 1).path
    source = ("import raytrain_nb as train\nseen = []\nfor i in range(3):\n"
              "    train.report({'i': i})\n"
              f"    seen.append(open({path!r}, 'rb').read().split()[-1])\n")  # read right after it returned
    out = w.run_cell(source, 1, report_base=7)
    assert out.failure is None and out.reports == 3
    assert w.pull("seen") == [b"7", b"8", b"9"]
    assert [r["report"] for r in out.metrics] == ["checkpoint_000007", "checkpoint_000008", "checkpoint_000009"]
    assert [reported.report_index(r["report"]) for r in out.metrics] == [int(x) for x in ledger_lines(run.url, 1)]
    assert reported.ledger_ranks(run.url, 8, 2) == [1]  # what the driver reads after a crash
    out = w.run_cell("train.report({'i': 3})", 2, report_base=10)  # the next cell goes on from its own base
    assert out.metrics[0]["report"] == "checkpoint_000010" and ledger_lines(run.url, 1)[-1] == b"10"


def test_a_rank_without_a_run_directory_reports_without_a_ledger(tmp_path):
    w = Worker(capture=False)
    w.setup(CONTEXT, {}, "none", "127.0.0.1", 0)
    try:
        out = w.run_cell("import raytrain_nb as train\ntrain.report({'x': 1})", 1)
        assert out.failure is None and "report" not in out.metrics[0] and out.metrics[0]["metrics"] == {"x": 1}
    finally:
        session_mod.set_session(None)


def test_a_snapshot_asked_for_during_a_cell_is_taken_at_its_next_report(tmp_path):
    torch = pytest.importorskip("torch")
    w, run = make_worker(tmp_path, 0)  # rank 0 writes the variables
    try:
        w.run_cell("x = 1", 1)
        staged = reported.report_staging(run.url, "snap")
        w.request_snapshot(staged, ["x"])
        out = w.run_cell("import raytrain_nb as train\nx = 2\ntrain.report({'x': x})\nx = 3", 2)
        assert out.failure is None and w.snapshot_wait(30) == {"rank": 0}
        saved = torch.load(os.path.join(staged.path, "vars.pt"), weights_only=False)
        assert 2 in saved.values() and 3 not in saved.values()  # taken at the report, not at the cell's end
    finally:
        session_mod.set_session(None)
        run.close()


class _Spinner:
    """A thread that runs Python, noting the time every millisecond: it runs only while it holds the GIL."""

    def __init__(self) -> None:
        self.times: list = []
        self.stop = False
        self.thread = threading.Thread(target=self._spin, daemon=True)

    def _spin(self) -> None:
        last = 0.0
        while not self.stop:
            now = time.monotonic()
            if now - last > 0.001:
                self.times.append(now)
                last = now


def _python_ran_during_a_blocked_write(write) -> bool:
    """Whether another Python thread ran while ``write(fd, data)`` was blocked on a full pipe, which another
    process drains 1 s later. A thread that keeps the GIL in the call lets the other one run only around it
    (one switch interval, 5 ms, before or after): never in the middle of the block."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    try:
        while True:
            os.write(write_end, b"x" * 65536)
    except BlockingIOError:
        pass
    os.set_blocking(write_end, True)
    drainer = subprocess.Popen([sys.executable, "-c", "import sys, time; time.sleep(1.0); sys.stdin.buffer.read()"],
                               stdin=read_end)
    os.close(read_end)
    spinner = _Spinner()
    spinner.thread.start()
    try:
        wait_for(lambda: spinner.times, 30, "the spinner to start")
        start = time.monotonic()
        write(write_end, b"x")  # blocks until the drainer reads
        end = time.monotonic()
        assert end - start > 0.15, "the write did not block: the check needs it to"
        return any(start + 0.05 < t < end - 0.05 for t in list(spinner.times))
    finally:
        spinner.stop = True
        os.close(write_end)
        drainer.wait(30)
        spinner.thread.join(30)


def test_the_ledger_append_keeps_the_gil():
    """os.write lets the GIL go around write(2): a thread waiting for it (a Ray worker has several) may
    take it, and report() then waits for that thread's switch interval. The ledger's append keeps it."""
    if not reported.append_keeps_gil():
        pytest.skip("no C library to call write(2) through here")
    assert _python_ran_during_a_blocked_write(os.write)  # what the check sees of a write that lets go
    assert not _python_ran_during_a_blocked_write(reported.append)


def test_append_finishes_a_short_write_and_a_failed_one_and_raises_what_fails_again(tmp_path, monkeypatch):
    fd = os.open(str(tmp_path / "ledger"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    calls = []

    def short(fd_: int, data: bytes, n) -> int:
        calls.append((data, n.value))
        return os.write(fd_, data[:2])  # two bytes of it

    monkeypatch.setattr(reported, "_WRITE", short)
    reported.append(fd, b"12345\n")  # the rest through os.write
    monkeypatch.setattr(reported, "_WRITE", lambda fd_, data, n: -1)  # failed (EINTR): os.write again
    reported.append(fd, b"6\n")
    monkeypatch.setattr(reported, "_WRITE", lambda fd_, data, n: 0)
    reported.append(fd, b"7\n")
    monkeypatch.setattr(reported, "_WRITE", None)  # no C library: os.write
    reported.append(fd, b"8\n")
    monkeypatch.undo()
    reported.append(fd, b"9\n")
    reported.append(fd, b"x" * 40)  # longer than the lengths made in advance
    os.close(fd)
    assert calls == [(b"12345\n", 6)]
    with open(tmp_path / "ledger", "rb") as fh:
        assert fh.read() == b"12345\n6\n7\n8\n9\n" + b"x" * 40
    # An fd open for reading only: libc's write fails, os.write raises its errno. (Not the closed fd:
    # its number may be taken again meanwhile by any thread of this process, for any kind of file.)
    read_only = os.open(str(tmp_path / "ledger"), os.O_RDONLY)
    try:
        with pytest.raises(OSError) as info:
            reported.append(read_only, b"10\n")
    finally:
        os.close(read_only)
    assert info.value.errno == errno.EBADF


class _Scalar:
    def __init__(self, value, fails=False):
        self.value, self.fails = value, fails

    def item(self):
        if self.fails:
            raise ValueError("only one element tensors can be converted to Python scalars")
        return self.value


class _Num(float):
    def item(self):
        return "converted"


def test_metrics_are_made_plain_as_before_with_plain_numbers_kept_as_they_are():
    many = _Scalar(None, fails=True)
    metrics = {"loss": 0.5, "step": 3, "ok": True, "tag": "a", "none": None, "t": _Scalar(2.5), "many": many,
               7: 1, "sub": _Num(1.0)}
    plain = plain_metrics(metrics)
    assert plain == {str(k): _plain(v) for k, v in metrics.items()}  # the rule as it was: each value's .item()
    assert plain["t"] == 2.5 and plain["many"] is many and plain["7"] == 1 and plain["sub"] == "converted"
    assert type(plain["ok"]) is bool and list(plain) == [str(k) for k in metrics]
    np = pytest.importorskip("numpy")
    assert type(plain_metrics({"x": np.float32(1.5)})["x"]) is float


def test_the_session_queues_records_in_order_keeps_the_newest_and_calls_the_hook_with_each_index():
    session = WorkerSession(TrainContext(0, 1, 0, 1, 0), history=3)
    seen = []
    session.on_report = seen.append
    session.report_name = reported.report_name
    for i in range(5):
        session.report({"i": i}, total=10 if i == 4 else None)
    assert seen == [0, 1, 2, 3, 4] and session.reports_this_cell == 5 and session.history == 3
    records = session.drain()
    assert [r["metrics"]["i"] for r in records] == [2, 3, 4] and [r["seq"] for r in records] == [3, 4, 5]
    assert records[-1]["total"] == 10 and "total" not in records[0]
    assert records[0]["report"] == "checkpoint_000002" and session.drain() == []
    with pytest.raises(TypeError):
        session.report([1.0])
    assert seen == [0, 1, 2, 3, 4]  # a refused report is not recorded
    with pytest.raises(RuntimeError, match="needs a run directory"):
        session.report({"x": 1}, checkpoint=object())
