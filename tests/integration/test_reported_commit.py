"""Reported checkpoints commit only when every rank of the world reported them, on a local disk and
on S3 (a local S3 server), live and after a crash; the newest is the highest report index.

These drive :class:`RunStorage` directly with what workers write (``reported.upload``): no Ray.
"""
from __future__ import annotations

import pathlib
import uuid

import pytest

from raytrain_nb._internal.checkpoint import reported
from raytrain_nb._internal.checkpoint.run_storage import RunStorage

from .conftest import BUCKET


@pytest.fixture(params=["local", "s3"])
def root(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "runs")
    request.getfixturevalue("endpoint")
    return f"s3://{BUCKET}/reported-{uuid.uuid4().hex[:8]}"


def upload(run_url, index, rank, world, tmp_path, files=True):
    """What ``report(metrics, checkpoint=...)`` does on rank ``rank`` of a ``world``-rank group."""
    local = tmp_path / f"r{rank}-{index}"
    local.mkdir()
    (local / f"rank{rank}.txt").write_text(f"rank {rank} index {index}")
    staged = reported.report_staging(run_url, reported.report_name(index))
    reported.upload(staged, rank, str(local), {"step": index, "rank": rank}, world_size=world)


def record(rank, index, files):
    return {"rank": rank, "report": reported.report_name(index), "checkpoint": files, "time": 0.0,
            "metrics": {"step": index}}


def reported_names(run):
    return [e.name for e in run.manager.list("reported")]


def test_a_set_missing_a_rank_is_discarded_and_a_complete_one_committed_when_the_run_reopens(root, tmp_path):
    run = RunStorage(root, "r1")
    upload(run.url, 1, 0, 2, tmp_path)
    upload(run.url, 1, 1, 2, tmp_path)  # every rank of the 2-rank world uploaded: every rank reported
    upload(run.url, 2, 0, 2, tmp_path)  # rank 1 died before its report()
    run.close()  # the kernel ended
    reopened = RunStorage(root, "r1")  # a new kernel (or the trainer's next attempt) opens the run
    assert reported_names(reopened) == ["checkpoint_000001"]
    assert reported.pending_names(reopened.url) == []  # the incomplete set is gone, not committed later
    assert reopened.report_base == 3  # and its index is not reused by this writer


def test_rank0_only_files_commit_once_every_rank_reported(root, tmp_path):
    run = RunStorage(root, "r2")
    upload(run.url, run.report_base, 0, 2, tmp_path)  # only rank 0 passes files (the common case)
    run.on_records([record(0, 1, True)], world_size=2)
    assert reported_names(run) == []  # rank 1 has not reported yet
    run.on_records([record(1, 1, False)], world_size=2)
    assert reported_names(run) == ["checkpoint_000001"]
    with run.manager.list("reported")[0].checkpoint.as_directory() as local:
        assert sorted(p.name for p in pathlib.Path(local).iterdir() if not p.name.startswith(".")) == ["rank0.txt"]


def test_a_report_missing_a_rank_is_not_committed_live_and_is_discarded_on_restart(root, tmp_path):
    run = RunStorage(root, "r3")
    upload(run.url, 1, 0, 2, tmp_path)
    run.on_records([record(0, 1, True)], world_size=2)  # rank 1 dies before report(): no record comes
    assert run.recover() == []  # what a restart does
    assert reported_names(run) == [] and reported.pending_names(run.url) == []


def test_every_rank_reported_but_the_driver_crashed_before_the_commit(root, tmp_path):
    run = RunStorage(root, "r4")
    upload(run.url, 1, 0, 2, tmp_path)
    reported.mark_complete(reported.report_staging(run.url, "checkpoint_000001"), 2, {"step": 1})
    run.close()  # the driver crashed before its commit
    reopened = RunStorage(root, "r4")
    assert reported_names(reopened) == ["checkpoint_000001"]
    assert reopened.manager.list("reported")[0].metrics == {"step": 1}


def test_a_leftover_committed_late_does_not_become_the_newest(root, tmp_path):
    run = RunStorage(root, "r5")
    for rank in (0, 1):
        upload(run.url, 2, rank, 2, tmp_path)  # complete, but a crashed kernel never committed it
    upload(run.url, 3, 0, 2, tmp_path)
    run.on_records([record(0, 3, True), record(1, 3, False)], world_size=2)  # committed live
    assert reported_names(run) == ["checkpoint_000003"]
    run.recover()  # a restart commits the leftover after the newer one
    assert sorted(reported_names(run)) == ["checkpoint_000002", "checkpoint_000003"]
    assert run.manager.latest("reported").name == "checkpoint_000003"
    run.close()
    assert RunStorage(root, "r5").manager.latest("reported").name == "checkpoint_000003"


def test_a_rank_whose_record_died_with_it_is_known_to_have_reported_by_its_ledger(tmp_path):
    # local disks: each rank appends the index of every report to its ledger, which outlives the process
    run = RunStorage(str(tmp_path / "runs"), "r6")
    upload(run.url, 1, 0, 2, tmp_path)  # rank 0's files of report 1 ...
    upload(run.url, 2, 0, 2, tmp_path)  # ... and of report 2
    ledger = reported.ReportLedger(run.url, 1)
    ledger.add(1)  # rank 1 reported 1, then was killed before the driver polled its record, before report 2
    ledger.close()
    run.close()
    reopened = RunStorage(str(tmp_path / "runs"), "r6")
    assert reported_names(reopened) == ["checkpoint_000001"]
    assert reported.pending_names(reopened.url) == [] and reopened.report_base == 3
