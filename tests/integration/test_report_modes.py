"""``report()``'s Ray Train V2 options on one rank's session over a real run directory (no Ray): directory names,
ASYNC uploads (in order, a failure raised into the training thread), NO_UPLOAD, an upload function, and the
one-line errors; the driver's side is :class:`RunStorage` committing what the records say."""
from __future__ import annotations

import os
import threading
import time

import pytest

import raytrain_nb
from raytrain_nb import Checkpoint, CheckpointUploadMode, ValidationTaskConfig
from raytrain_nb._internal.checkpoint import reported
from raytrain_nb._internal.checkpoint.run_storage import RunStorage
from raytrain_nb._internal.errors import CheckpointUploadError
from raytrain_nb._internal.worker import session, upload_plan
from raytrain_nb._internal.worker.context import TrainContext
from raytrain_nb._internal.worker.uploads import UploadQueue


class Rank:
    """Rank 0 of a 1-rank world as the worker wires its session (``checkpointing.py``), and the driver's run."""

    def __init__(self, root, name):
        self.run = RunStorage(str(root), name)
        self.sess = session.WorkerSession(TrainContext(0, 1, 0, 1, 0, name))
        used = set()
        base = self.run.report_base
        self.sess.report_name = lambda i: reported.report_name(base + i)
        self.sess.prepare_upload = lambda i, ckpt, m, opts: upload_plan.plan(
            self.run.url, reported.report_name(base + i), 0, 1, ckpt, m, opts, used)
        self.sess.upload = lambda i, ckpt, m: self.sess.prepare_upload(i, ckpt, m, None)()
        self.sess.uploads = UploadQueue()
        self.sess.reported = lambda mode, timeout: upload_plan.reported_checkpoints(
            self.run.url, base + self.sess.reports_this_cell - 1, mode, timeout)
        session.set_session(self.sess)

    def commit(self):
        """What the driver's poll does with the records."""
        self.sess.uploads.wait(30)
        self.run.on_records(self.sess.drain(), world_size=1)
        return [(e.name, e.metrics.get("epoch")) for e in self.run.manager.list("reported")]


@pytest.fixture
def rank(tmp_path):
    r = Rank(tmp_path / "runs", "modes")
    yield r
    session.set_session(None)
    r.run.close()


def local_checkpoint(tmp_path, tag, size=10):
    d = tmp_path / f"local-{tag}"
    d.mkdir()
    (d / "model.bin").write_bytes(b"x" * size)
    return Checkpoint.from_directory(str(d))


def test_async_reports_commit_under_their_names_in_order_and_delete_the_local_copy(rank, tmp_path):
    ckpts = [local_checkpoint(tmp_path, i) for i in range(3)]
    for epoch, ckpt in enumerate(ckpts):
        raytrain_nb.report({"epoch": epoch}, checkpoint=ckpt, checkpoint_dir_name=f"epoch_{epoch}",
                           checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
    raytrain_nb.report({"epoch": 3})  # after ASYNC ones: its record waits its turn, training does not
    assert rank.commit() == [("epoch_0", 0), ("epoch_1", 1), ("epoch_2", 2)]
    assert not any(os.path.exists(c.path) for c in ckpts)  # ASYNC deletes the local directory by default
    assert os.path.isfile(os.path.join(rank.run.url, "epoch_2", "model.bin"))
    assert rank.run.manager.latest("reported").name == "epoch_2"  # newest by report index, whatever the name
    listed = raytrain_nb.get_all_reported_checkpoints(timeout_s=10)
    assert [(os.path.basename(r.checkpoint.path), r.status.value) for r in listed] == [
        ("epoch_0", "COMMITTED"), ("epoch_1", "COMMITTED"), ("epoch_2", "COMMITTED")]


def test_sync_keeps_the_local_copy_and_a_used_name_is_refused_in_one_line(rank, tmp_path):
    ckpt = local_checkpoint(tmp_path, "a")
    raytrain_nb.report({"epoch": 0}, checkpoint=ckpt, checkpoint_dir_name="best")
    assert os.path.exists(ckpt.path)
    with pytest.raises(ValueError, match=r"checkpoint_dir_name='best'.*has a checkpoint directory of that name"):
        raytrain_nb.report({"epoch": 1}, checkpoint=local_checkpoint(tmp_path, "b"), checkpoint_dir_name="best")
    assert rank.commit() == [("best", 0)]  # nothing of the refused report was queued or committed


def test_no_upload_and_an_upload_function_take_a_directory_inside_the_run(rank, tmp_path):
    inside = os.path.join(rank.run.url, "mine")
    os.makedirs(inside)
    open(os.path.join(inside, "w.bin"), "wb").close()
    raytrain_nb.report({"epoch": 0}, checkpoint=Checkpoint(inside),
                       checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)

    def upload_fn(checkpoint, name):
        dest = os.path.join(rank.run.url, name)
        os.makedirs(dest)
        for f in os.listdir(checkpoint.path):
            os.link(os.path.join(checkpoint.path, f), os.path.join(dest, f))
        return Checkpoint(dest)

    raytrain_nb.report({"epoch": 1}, checkpoint=local_checkpoint(tmp_path, "u"), checkpoint_dir_name="by_fn",
                       checkpoint_upload_fn=upload_fn)
    assert rank.commit() == [("mine", 0), ("by_fn", 1)]
    with pytest.raises(ValueError, match=r"NO_UPLOAD\)'s checkpoint .* is not a directory directly inside the run"):
        raytrain_nb.report({}, checkpoint=local_checkpoint(tmp_path, "out"),
                           checkpoint_upload_mode=CheckpointUploadMode.NO_UPLOAD)
    with pytest.raises(ValueError, match=r"the checkpoint that checkpoint_upload_fn returned .* not a directory"):
        raytrain_nb.report({}, checkpoint=local_checkpoint(tmp_path, "o2"), checkpoint_upload_fn=lambda c, n: c)
    assert rank.commit() == [("mine", 0), ("by_fn", 1)]


def test_a_failed_async_upload_is_raised_into_the_training_thread(rank, tmp_path):
    def broken(checkpoint, name):
        raise OSError("disk full")

    raised = []

    def train():
        try:
            raytrain_nb.report({}, checkpoint=local_checkpoint(tmp_path, "f"), checkpoint_upload_fn=broken,
                               checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:  # the training loop goes on: the failure lands in it
                time.sleep(0.01)
        except CheckpointUploadError as exc:
            raised.append(str(exc))

    t = threading.Thread(target=train)
    t.start()
    t.join(15)
    assert raised and "disk full" in raised[0] and "checkpoint_000001" in raised[0]
    rank.sess.uploads.abandon()
    assert rank.commit() == []


def test_bad_options_are_one_line_errors_naming_the_value(rank, tmp_path):
    ckpt = local_checkpoint(tmp_path, "e")
    cases = [(dict(checkpoint_upload_mode="FAST"), r"checkpoint_upload_mode='FAST'.*CheckpointUploadMode.SYNC"),
             (dict(checkpoint_dir_name="../up"), r"checkpoint_dir_name='../up'.*not a directory name"),
             (dict(validation=True), r"no validation function was given.*validation_config=ValidationConfig"),
             (dict(validation="yes"), r"validation='yes'.*ValidationTaskConfig"),
             (dict(checkpoint_upload_fn=3), r"checkpoint_upload_fn=3.*not callable")]
    for kwargs, match in cases:
        with pytest.raises(ValueError, match=match) as info:
            raytrain_nb.report({}, checkpoint=ckpt, **kwargs)
        assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=r"validation=.*without a checkpoint"):
        rank.sess.has_validation = True
        raytrain_nb.report({}, validation=ValidationTaskConfig(timeout_s=1))
    holder = tmp_path / "holder"
    run_inside = RunStorage(str(holder), "inner")
    try:
        with pytest.raises(ValueError, match=r"is inside the checkpoint's directory.*delete_local_checkpoint_after"):
            upload_plan.plan(run_inside.url, "checkpoint_000001", 0, 1, Checkpoint(str(holder)), {},
                             raytrain_nb._internal.worker.report_api.ReportOptions(delete_local=True), set())
    finally:
        run_inside.close()
    assert rank.sess.reports_this_cell == 0 and rank.commit() == []


def test_on_s3_an_async_report_commits_under_its_name_and_a_killed_upload_is_discarded(endpoint, tmp_path):
    import uuid

    from .conftest import BUCKET

    r = Rank(f"s3://{BUCKET}/modes-{uuid.uuid4().hex[:8]}", "s3run")
    try:
        raytrain_nb.report({"epoch": 0}, checkpoint=local_checkpoint(tmp_path, "s0"), checkpoint_dir_name="epoch_0",
                           checkpoint_upload_mode=CheckpointUploadMode.ASYNC)
        assert r.commit() == [("epoch_0", 0)]
        with pytest.raises(ValueError, match=r"checkpoint_dir_name='epoch_0'.*that name already"):
            raytrain_nb.report({}, checkpoint=local_checkpoint(tmp_path, "s1"), checkpoint_dir_name="epoch_0")
        # a 2-rank set whose rank 1 started its upload of epoch_1 and died: the run's next opening discards it
        staged = reported.report_staging(r.run.url, reported.report_name(r.run.report_base + 5), "epoch_1")
        reported.upload(staged, 0, local_checkpoint(tmp_path, "s2").path, {}, world_size=2)
        staged.fs.pipe_file(reported.marker(staged, 1, "started"), b'{"dir": "epoch_1"}')
        r.run.close()
        reopened = RunStorage(r.run.url.rsplit("/", 1)[0], "s3run")
        try:
            assert [e.name for e in reopened.manager.list("reported")] == ["epoch_0"]
            assert reported.pending_names(reopened.url) == [] and not staged.fs.exists(staged.final_path)
        finally:
            reopened.close()
    finally:
        session.set_session(None)
        r.run.close()
