"""A real S3 round trip through s3fs against moto's server on 127.0.0.1 (no Ray, no network).

The server runs in a thread of this process on a free port; s3fs finds it through
``AWS_ENDPOINT_URL`` with fake credentials, exactly as a user's ``s3://`` URL would.
"""
from __future__ import annotations

import logging
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import uuid

import pytest

moto_server = pytest.importorskip("moto.server")
s3fs = pytest.importorskip("s3fs")

from raytrain_nb._internal.checkpoint import storage_check  # noqa: E402
from raytrain_nb._internal.checkpoint import storage
from raytrain_nb._internal.checkpoint.checkpoint import Checkpoint  # noqa: E402
from raytrain_nb._internal.checkpoint.manager import CheckpointManager  # noqa: E402
from raytrain_nb._internal.checkpoint.metrics_log import append_metrics, read_metrics  # noqa: E402
from raytrain_nb._internal.checkpoint.staging import (COMMIT_MARKER, WRITING_MARKER, atomic_dir,  # noqa: E402
                                                      begin_dir, clean_staging, list_committed)
from raytrain_nb._internal.errors import CheckpointError  # noqa: E402

BUCKET = "raytrain-nb-test"


@pytest.fixture(scope="module")
def endpoint():
    """moto's S3 server on 127.0.0.1 (a free port), with fake credentials in the environment."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    env = pytest.MonkeyPatch()
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": url,
                       "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                       "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}.items():
        env.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        env.delenv(key, raising=False)
    s3fs.S3FileSystem.clear_instance_cache()
    fs, _ = storage.resolve(f"s3://{BUCKET}")
    fs.mkdir(BUCKET)
    yield url
    s3fs.S3FileSystem.clear_instance_cache()
    env.undo()
    server.stop()


@pytest.fixture
def run(endpoint):
    """A fresh run directory in the bucket."""
    return f"s3://{BUCKET}/runs/{uuid.uuid4().hex[:8]}"


def test_checkpoint_round_trip(run, tmp_path):
    storage.check_writable(run)
    storage.refuse_per_process(run)
    mgr = CheckpointManager(run, num_to_keep=2, score_attribute="acc")
    staged = mgr.begin("reported")
    assert staged.path == staged.final_path  # written in place, committed by the marker
    with staged.open("model.pt") as f:
        f.write(b"weights" * 1000)
    with staged.open("nested/optimizer.pt") as f:
        f.write(b"optimizer")
    assert list_committed(run) == []  # not yet committed: not listed
    entry = mgr.commit(staged, "reported", {"acc": 0.5, "step": 10})
    assert entry.path == f"{run}/checkpoint_000001" and entry.size_bytes == 7009 and entry.step == 10
    fs, path = storage.resolve(entry.path)
    assert fs.exists(f"{path}/{COMMIT_MARKER}") and not fs.exists(f"{path}/{WRITING_MARKER}")

    back = CheckpointManager.load(run)  # as a new kernel would
    assert [e.name for e in back.list()] == ["checkpoint_000001"] and back.num_to_keep == 2
    ckpt = back.get("checkpoint_000001").checkpoint
    assert repr(ckpt) == f"Checkpoint(filesystem=s3, path={path})"
    ckpt.set_metadata({"epoch": 3})
    ckpt.update_metadata({"note": "s3"})
    assert Checkpoint(entry.path).get_metadata() == {"epoch": 3, "note": "s3"}
    out = ckpt.to_directory(tmp_path / "out")
    assert open(os.path.join(out, "model.pt"), "rb").read() == b"weights" * 1000
    assert sorted(os.listdir(out)) == [".metadata.json", "model.pt", "nested"]
    with pickle.loads(pickle.dumps(ckpt)).as_directory() as d:
        assert open(os.path.join(d, "nested", "optimizer.pt"), "rb").read() == b"optimizer"
    assert not os.path.exists(d)


def test_pruning_and_persist_on_s3(run, tmp_path):
    (tmp_path / "w.pt").write_bytes(b"w")
    mgr = CheckpointManager(run, num_to_keep=1, score_attribute="loss", score_order="min")
    snap = mgr.persist(str(tmp_path), "snapshot")
    for loss in (0.3, 0.1, 0.2):
        mgr.persist(str(tmp_path), "reported", {"loss": loss})
    assert [e.metrics.get("loss") for e in mgr.list()] == [None, 0.1, 0.2]
    assert list_committed(run) == sorted(e.name for e in mgr.list())
    mgr.delete(snap.name)
    fs, path = storage.resolve(run)
    assert not fs.exists(f"{path}/{snap.name}") and len(CheckpointManager.load(run)) == 2


def test_interrupted_write_is_never_listed_or_loaded(run):
    with atomic_dir(run, "ckpt_1") as staged:
        with staged.open("model.pt") as f:
            f.write(b"good")
    with pytest.raises(RuntimeError, match="writer died"):
        with atomic_dir(run, "ckpt_2") as staged:
            with staged.open("model.pt") as f:
                f.write(b"half")
            raise RuntimeError("writer died")
    partial = begin_dir(run, "ckpt_3")  # a writer that vanished without cleaning up
    with partial.open("model.pt") as f:
        f.write(b"half")
    assert list_committed(run) == ["ckpt_1"]
    with pytest.raises(CheckpointError, match=r"ckpt_3 was interrupted mid-write"):
        Checkpoint(partial.url).to_directory()
    assert clean_staging(run, older_than_s=3600) == []
    assert clean_staging(run) == [partial.url]
    with Checkpoint(f"{run}/ckpt_1").as_directory() as d:
        assert open(os.path.join(d, "model.pt"), "rb").read() == b"good"


KILLED_WRITER = textwrap.dedent("""
    import sys
    from raytrain_nb._internal.checkpoint.staging import begin_dir
    staged = begin_dir(sys.argv[1], "ckpt_2")
    with staged.open("model.pt") as f:
        f.write(b"x" * 1000)
    staged.fs.pipe_file(staged.path + "/optimizer.pt", b"half")
    print("WRITING", flush=True)
    sys.stdin.read()  # blocks: killed here, before the commit
""")


def test_sigkill_mid_write(run):
    with atomic_dir(run, "ckpt_1") as staged:
        with staged.open("model.pt") as f:
            f.write(b"good")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, run], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "WRITING"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdin.close()
        proc.stdout.close()
    fs, path = storage.resolve(run)
    fs.invalidate_cache()
    assert fs.exists(f"{path}/ckpt_2/model.pt")  # the partial is there ...
    assert list_committed(run) == ["ckpt_1"]  # ... but never listed
    with Checkpoint(f"{run}/ckpt_1").as_directory() as d:  # the previous checkpoint still loads
        assert open(os.path.join(d, "model.pt"), "rb").read() == b"good"
    with pytest.raises(CheckpointError, match=r"ckpt_2 was interrupted mid-write"):
        Checkpoint(f"{run}/ckpt_2").to_directory()
    assert clean_staging(run) == [f"{run}/ckpt_2"]
    with atomic_dir(run, "ckpt_2") as staged:  # the name is free again
        with staged.open("model.pt") as f:
            f.write(b"again")
    assert list_committed(run) == ["ckpt_1", "ckpt_2"]


def test_metrics_and_storage_check_on_s3(run):
    append_metrics(run, {"step": 1, "loss": 0.5})
    append_metrics(run, {"step": 2, "loss": 0.25})
    assert read_metrics(run) == [{"step": 1, "loss": 0.5}, {"step": 2, "loss": 0.25}]
    token = storage_check.write_marker(run)
    for rank in range(2):
        storage_check.read_marker(run, token, rank=rank)
    assert sorted(storage_check.collect_markers(run, token, ranks=[0, 1])) == [0, 1]
    storage_check.clear_markers(run, token)


def test_explicit_filesystem_with_storage_options(endpoint, run):
    fs = s3fs.S3FileSystem(key="testing", secret="testing", endpoint_url=endpoint, skip_instance_cache=True)
    mgr = CheckpointManager(run, filesystem=fs)
    staged = mgr.begin("snapshot")
    with staged.open("w") as f:
        f.write(b"w")
    entry = mgr.commit(staged, "snapshot")
    ckpt = pickle.loads(pickle.dumps(entry.checkpoint))
    assert ckpt.filesystem.endpoint_url == endpoint
    with ckpt.as_directory() as d:
        assert os.listdir(d) == ["w"]
