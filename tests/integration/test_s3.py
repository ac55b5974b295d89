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
import json
import socket
import textwrap
import uuid

import pytest

moto_server = pytest.importorskip("moto.server")
s3fs = pytest.importorskip("s3fs")

from raytrain_nb._internal.checkpoint import staging, storage_check  # noqa: E402
from raytrain_nb._internal.checkpoint import storage
from raytrain_nb._internal.checkpoint.checkpoint import Checkpoint  # noqa: E402
from raytrain_nb._internal.checkpoint.manager import CheckpointManager  # noqa: E402
from raytrain_nb._internal.checkpoint.metrics_log import append_metrics, read_metrics  # noqa: E402
from raytrain_nb._internal.checkpoint.staging import (COMMIT_MARKER, WRITING_MARKER, atomic_dir,  # noqa: E402
                                                      begin_dir, clean_leftovers, clean_staging, list_committed,
                                                      read_manifest)
from raytrain_nb._internal.errors import CheckpointError  # noqa: E402

from .conftest import BUCKET  # noqa: E402


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


# ---------------------------------------------------------------- no object in the bucket is trusted


def put_object(endpoint, key, body):
    """Write ``key`` with boto3 directly, exactly as spelled (s3fs would not keep '..' in a key)."""
    import boto3  # the raw client: the only way to plant a literal '..' key

    client = boto3.client("s3", endpoint_url=endpoint)
    client.put_object(Bucket=BUCKET, Key=key, Body=body)
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=key.split("/..")[0])["Contents"]]
    assert key in keys, keys


def tree(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


def test_planted_objects_are_never_copied_out(endpoint, run, tmp_path, monkeypatch):
    with atomic_dir(run, "ck") as staged:
        with staged.open("model.pt") as f:
            f.write(b"good")
    key = staged.final_path.split("/", 1)[1]
    put_object(endpoint, f"{key}/../../../../evil.txt", b"evil")
    put_object(endpoint, f"{key}/extra.bin", b"planted")
    dest = tmp_path / "out" / "a" / "b" / "c" / "dest"
    assert Checkpoint(staged.final_url).to_directory(dest) == str(dest)
    assert tree(tmp_path) == ["out/a/b/c/dest/model.pt"]
    deep = tmp_path / "t1" / "t2" / "t3" / "tmp"
    deep.mkdir(parents=True)
    monkeypatch.setattr("tempfile.tempdir", str(deep))
    with Checkpoint(staged.final_url).as_directory() as d:
        assert sorted(os.listdir(d)) == ["model.pt"]
    assert tree(tmp_path) == ["out/a/b/c/dest/model.pt"]
    plain = f"{run.split('/', 3)[3]}/plain"  # no manifest: every listed file, so the name is refused
    put_object(endpoint, f"{plain}/w.pt", b"w")
    put_object(endpoint, f"{plain}/../../../../evil.txt", b"evil")
    with pytest.raises(CheckpointError, match=r"^checkpoint s3://.*/plain lists the file '\.\./\.\./\.\./\.\./evil"
                                              r"\.txt', which is absolute or leaves the checkpoint"):
        Checkpoint(f"{run}/plain").to_directory(dest)
    with pytest.raises(CheckpointError, match=r"lists the file '\.\./\.\./\.\./\.\./evil\.txt'"):
        with Checkpoint(f"{run}/plain").as_directory():
            pass
    assert tree(tmp_path) == ["out/a/b/c/dest/model.pt"]


def test_index_entries_outside_the_run_are_never_deleted(run, caplog):
    fs, path = storage.resolve(run)
    other = CheckpointManager(f"{run}-other")
    with atomic_dir(f"{run}-other", "checkpoint_000001") as victim:
        with victim.open("w") as f:
            f.write(b"theirs")
    other.register("checkpoint_000001", "reported", victim.final_url)
    mgr = CheckpointManager(run, num_to_keep=1)
    first = mgr.persist(other.get(0).checkpoint, "reported")
    index = f"{path}/checkpoints.json"
    data = json.loads(fs.cat_file(index))
    outside = [f"../{run.rsplit('/', 1)[1]}-other/checkpoint_000001", victim.final_url, victim.final_path,
               f"s3://another-bucket/{victim.final_path.split('/', 1)[1]}"]
    data["checkpoints"] = [dict(data["checkpoints"][0], name=f"bad{i}", path=p) for i, p in enumerate(outside)] + \
        data["checkpoints"]
    fs.pipe_file(index, json.dumps(data).encode())
    with caplog.at_level(logging.WARNING):
        mgr = CheckpointManager.load(run)
    assert [e.name for e in mgr.list()] == [first.name]
    assert all(f"entry 'bad{i}'" in caplog.text for i in range(len(outside)))
    for _ in range(2):
        mgr.persist(other.get(0).checkpoint, "reported")
    assert len(mgr.list()) == 1 and read_manifest(fs, victim.final_path) is not None
    assert list_committed(f"{run}-other") == ["checkpoint_000001"]
    assert [e["path"] for e in json.loads(fs.cat_file(index))["checkpoints"]] == [mgr.list()[0].name]


def test_metrics_after_a_torn_line_on_s3(run, caplog):
    append_metrics(run, {"step": 1})
    fs, path = storage.resolve(f"{run}/metrics.jsonl")
    fs.pipe_file(path, fs.cat_file(path) + b'{"step": 2, "lo')
    append_metrics(run, {"step": 3})
    with caplog.at_level(logging.WARNING):
        assert read_metrics(run) == [{"step": 1}, {"step": 3}]
    assert f"s3://{path} line 2 skipped" in caplog.text


DEAD_WRITER = textwrap.dedent("""
    import sys
    from raytrain_nb._internal.checkpoint.staging import begin_dir
    staged = begin_dir(sys.argv[1], "dead")
    with staged.open("model.pt") as f:
        f.write(b"half")
""")


def test_clean_leftovers_on_s3(run, monkeypatch):
    with atomic_dir(run, "ck") as staged:
        with staged.open("model.pt") as f:
            f.write(b"good")
    out = subprocess.run([sys.executable, "-c", DEAD_WRITER, run], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr  # exited without committing: its pid is gone
    alive = begin_dir(run, "alive")
    far = begin_dir(run, "far")
    far.fs.pipe_file(f"{far.path}/{WRITING_MARKER}", json.dumps({"host": "elsewhere", "pid": 1}).encode())
    fs, path = storage.resolve(run)
    fs.pipe_file(f"{path}/user_dir/f", b"mine")  # no marker: never ours
    assert clean_leftovers(run) == [f"{run}/dead"]
    monkeypatch.setattr(staging, "LEFTOVER_AGE_S", 0.0)  # as if an hour went by
    assert clean_leftovers(run) == [f"{run}/far"]
    assert socket.gethostname() in fs.cat_file(f"{alive.path}/{WRITING_MARKER}").decode()
    assert fs.exists(f"{path}/user_dir/f") and list_committed(run) == ["ck"]
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[1] for p in fs.ls(path)) == ["alive", "ck", "user_dir"]
