"""Checkpoint: the ray.train.Checkpoint API over local paths and memory:// (no Ray)."""
from __future__ import annotations

import os
import pathlib
import pickle
import shutil
import threading

import cloudpickle
import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from raytrain_nb._internal.checkpoint import storage
from raytrain_nb._internal.checkpoint.checkpoint import Checkpoint
from raytrain_nb._internal.checkpoint.staging import COMMIT_MARKER, METADATA_FILE, atomic_dir, begin_dir
from raytrain_nb._internal.errors import CheckpointError


@pytest.fixture(params=["local", "memory"])
def ckpt(request, tmp_path, mem_url):
    """A committed checkpoint with a nested file, on the local disk and on memory://."""
    parent = str(tmp_path / "run") if request.param == "local" else mem_url + "/run"
    with atomic_dir(parent, "ck") as staged:
        with staged.open("model.pt") as f:
            f.write(b"weights")
        with staged.open("nested/opt.pt") as f:
            f.write(b"optimizer")
    return Checkpoint(staged.final_url)


def test_construction(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    c = Checkpoint("~/ck")
    assert c.path == str(tmp_path / "ck") and isinstance(c.filesystem, LocalFileSystem)
    assert Checkpoint.from_directory(pathlib.Path(tmp_path / "d")).path == str(tmp_path / "d")
    assert repr(c) == f"Checkpoint(filesystem=local, path={tmp_path}/ck)"
    m = Checkpoint("memory://bucket/ck")
    assert repr(m) == "Checkpoint(filesystem=memory, path=/bucket/ck)" and m.url == "memory:///bucket/ck"
    mem = MemoryFileSystem()
    assert Checkpoint("memory://x/y", filesystem=mem).filesystem is mem


def test_to_directory_copies_everything_but_the_marker(ckpt, tmp_path):
    ckpt.set_metadata({"epoch": 2})
    out = ckpt.to_directory()
    try:
        assert sorted(os.listdir(out)) == [METADATA_FILE, "model.pt", "nested"]
        assert open(os.path.join(out, "nested", "opt.pt"), "rb").read() == b"optimizer"
        assert Checkpoint(out).get_metadata() == {"epoch": 2}
    finally:
        shutil.rmtree(out)
    target = tmp_path / "given" / "dir"
    assert ckpt.to_directory(target) == str(target)
    assert (target / "model.pt").read_bytes() == b"weights" and not (target / COMMIT_MARKER).exists()


def test_to_directory_onto_itself(tmp_path):
    (tmp_path / "f").write_text("x")
    assert Checkpoint(tmp_path).to_directory(tmp_path) == str(tmp_path)
    assert (tmp_path / "f").read_text() == "x"


def test_as_directory(ckpt):
    with ckpt.as_directory() as d:
        assert open(os.path.join(d, "model.pt"), "rb").read() == b"weights"
        if storage.is_local(ckpt.filesystem):
            assert d == ckpt.path  # no copy
        else:
            assert os.path.isdir(d) and d != ckpt.path
    if not storage.is_local(ckpt.filesystem):
        assert not os.path.exists(d)  # the temporary copy is gone


def test_metadata(ckpt):
    assert ckpt.get_metadata() == {}

    class Scalar:
        def item(self):
            return 0.25

    ckpt.set_metadata({"epoch": 1, "loss": Scalar()})
    assert ckpt.get_metadata() == {"epoch": 1, "loss": 0.25}
    ckpt.update_metadata({"epoch": 2, "note": "ok"})
    assert ckpt.get_metadata() == {"epoch": 2, "loss": 0.25, "note": "ok"}
    ckpt.set_metadata({})
    assert ckpt.get_metadata() == {}
    with ckpt.as_directory():  # metadata may change after commit; the checkpoint still verifies
        pass


@pytest.mark.parametrize("call", ["set_metadata", "update_metadata"])
def test_metadata_must_be_a_dict(ckpt, call):
    with pytest.raises(CheckpointError, match=r"^metadata=\[1\] is not a dict: pass e.g. \{'epoch': 3\}$"):
        getattr(ckpt, call)([1])


def test_metadata_must_be_json(ckpt):
    with pytest.raises(CheckpointError, match=r"^metadata\['model'\] cannot be stored as JSON \(a object is not "
                                              r"JSON-serializable\): use str, int"):
        ckpt.set_metadata({"epoch": 1, "model": object()})
    assert ckpt.get_metadata() == {}


def test_damaged_metadata(ckpt):
    meta = storage.join(ckpt.path, METADATA_FILE)
    ckpt.filesystem.pipe_file(meta, b'{"epoch": ')
    with pytest.raises(CheckpointError, match=rf"^checkpoint metadata {ckpt.url}/.metadata.json is damaged "
                                              r"\(truncated or edited\?\): .*; set it again with set_metadata$"):
        ckpt.get_metadata()
    ckpt.filesystem.pipe_file(meta, b"[1, 2]")
    with pytest.raises(CheckpointError, match=r"\.metadata\.json holds a list, not a JSON object: set it again"):
        ckpt.get_metadata()
    ckpt.set_metadata({"fixed": True})
    assert ckpt.get_metadata() == {"fixed": True}


def test_missing_directory(tmp_path, mem_url):
    for c in (Checkpoint(tmp_path / "nope"), Checkpoint(mem_url + "/nope")):
        for call in (c.get_metadata, lambda: c.set_metadata({}), c.to_directory):
            with pytest.raises(CheckpointError, match=rf"^checkpoint directory {c.url} does not exist$"):
                call()
        with pytest.raises(CheckpointError, match="does not exist"):
            with c.as_directory():
                pass


def test_interrupted_checkpoint_is_never_loaded(tmp_path, mem_url):
    for parent in (str(tmp_path), mem_url):
        staged = begin_dir(parent, "partial")
        with staged.open("model.pt") as f:
            f.write(b"half")
        c = Checkpoint(staged.url)
        with pytest.raises(CheckpointError, match=r"was interrupted mid-write .*: load an earlier checkpoint"):
            c.to_directory()
        with pytest.raises(CheckpointError, match=r"was interrupted mid-write"):
            with c.as_directory():
                pass


def test_truncated_file_is_never_loaded(ckpt, tmp_path):
    ckpt.filesystem.pipe_file(storage.join(ckpt.path, "nested/opt.pt"), b"opt")
    with pytest.raises(CheckpointError, match=rf"^checkpoint file {ckpt.url}/nested/opt.pt has 3 bytes but had 9 "
                                              r"when committed \(truncated or edited\?\): load another checkpoint$"):
        ckpt.to_directory(tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(CheckpointError, match="has 3 bytes but had 9"):
        with ckpt.as_directory():
            pass


def test_failed_copy_leaves_no_temp_dir(ckpt, monkeypatch, tmp_path):
    monkeypatch.setattr("tempfile.mkdtemp", lambda prefix: str(tmp_path / "tmpcopy"))
    monkeypatch.setattr(type(ckpt.filesystem), "get",
                        lambda self, *a, **k: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    with pytest.raises(CheckpointError, match=rf"^cannot copy checkpoint {ckpt.url} to {tmp_path}/tmpcopy: OSError: "
                                              r"\[Errno 28\] No space left on device$"):
        ckpt.to_directory()
    assert not (tmp_path / "tmpcopy").exists()


@pytest.mark.parametrize("dumps", [pickle.dumps, cloudpickle.dumps], ids=["pickle", "cloudpickle"])
def test_pickle_round_trip(ckpt, dumps):
    ckpt.set_metadata({"k": "v"})
    back = pickle.loads(dumps(ckpt))
    assert back.path == ckpt.path and type(back.filesystem) is type(ckpt.filesystem)
    assert back.get_metadata() == {"k": "v"}


def test_unpicklable_filesystem_travels_as_its_url(mem_url):
    class LockedMemoryFS(MemoryFileSystem):  # a local class: pickle cannot import it
        lock = threading.Lock()

    fs = LockedMemoryFS()
    fs.makedirs(mem_url[len("memory://"):] + "/ck", exist_ok=True)
    fs.pipe_file(mem_url[len("memory://"):] + "/ck/w", b"w")
    c = Checkpoint(mem_url + "/ck", filesystem=fs)
    back = pickle.loads(pickle.dumps(c))
    assert type(back.filesystem) is MemoryFileSystem and back.path == c.path
    with back.as_directory() as d:
        assert open(os.path.join(d, "w"), "rb").read() == b"w"
