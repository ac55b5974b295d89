"""Storage layer: resolving paths, atomic directories, the storage-sharing check (no Ray)."""
from __future__ import annotations

import json
import logging
import os
import pathlib
import pickle
import signal
import subprocess
import sys
import textwrap

import pytest
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.registry import known_implementations

from raytrain_nb._internal.checkpoint import staging, storage, storage_check
from raytrain_nb._internal.checkpoint.staging import (COMMIT_MARKER, STAGING_DIR, WRITING_MARKER, atomic_dir, begin_dir,
                                                      clean_staging, commit_dir, delete_dir, discard_dir, is_committed,
                                                      list_committed, read_manifest, verify_dir)
from raytrain_nb._internal.errors import CheckpointError, StorageError


def write(staged, rel, data=b"data"):
    with staged.open(rel) as f:
        f.write(data)


def committed(url, name, files=None):
    with atomic_dir(url, name) as staged:
        for rel, data in (files or {"model.pt": b"weights-" + name.encode()}).items():
            write(staged, rel, data)
    return staged


# ---------------------------------------------------------------- resolve


def test_resolve_local_paths(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    fs, path = storage.resolve("~/results")
    assert isinstance(fs, LocalFileSystem) and path == str(tmp_path / "results")
    assert storage.resolve("rel/dir")[1] == str(tmp_path / "rel" / "dir")
    assert storage.resolve(pathlib.Path("p"))[1] == str(tmp_path / "p")
    assert storage.resolve(f"file://{tmp_path}/x")[1] == str(tmp_path / "x")


def test_resolve_urls(mem_url):
    fs, path = storage.resolve(mem_url + "/a")
    assert isinstance(fs, MemoryFileSystem) and path == mem_url[len("memory://"):] + "/a"
    fs, path = storage.resolve("s3://bucket/runs/r1")
    assert "s3" in fs.protocol and path == "bucket/runs/r1"
    assert storage.to_url(fs, path) == "s3://bucket/runs/r1"


def test_resolve_with_a_filesystem(tmp_path, monkeypatch):
    mem = MemoryFileSystem()
    assert storage.resolve("memory://x/y", mem) == (mem, "/x/y")
    monkeypatch.setenv("HOME", str(tmp_path))
    assert storage.resolve("~/z", LocalFileSystem())[1] == str(tmp_path / "z")


def test_resolve_wraps_a_pyarrow_filesystem(tmp_path):
    pafs = pytest.importorskip("pyarrow.fs")
    fs, path = storage.resolve(str(tmp_path), pafs.LocalFileSystem())
    assert fs.isdir(path)


@pytest.mark.parametrize("bad", ["", "   ", None, 5])
def test_resolve_refuses_a_non_path(bad):
    with pytest.raises(StorageError, match=r"is not a path: pass a local path or a URL such as s3://"):
        storage.resolve(bad)


def test_resolve_refuses_a_non_filesystem():
    with pytest.raises(StorageError, match=r"filesystem='nope' is not a filesystem: pass an fsspec filesystem"):
        storage.resolve("/x", filesystem="nope")


def test_unknown_protocol():
    with pytest.raises(StorageError, match=r"'nosuch://b/x' uses the unknown protocol nosuch://: use a local path"):
        storage.resolve("nosuch://b/x")


def test_missing_implementation_package(monkeypatch):
    monkeypatch.setitem(known_implementations, "fakeproto",
                        {"class": "fakeproto_pkg_xyz.FakeFS", "err": "Install fakeproto_pkg_xyz"})
    with pytest.raises(StorageError, match=r"^fakeproto:// needs the fakeproto_pkg_xyz package: "
                                           r"pip install fakeproto_pkg_xyz$"):
        storage.resolve("fakeproto://bucket/x")


def test_missing_gcsfs_is_named():
    try:
        import gcsfs  # noqa: F401
        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    with pytest.raises(StorageError, match=r"^gs:// needs the gcsfs package: pip install gcsfs$"):
        storage.resolve("gs://bucket/run")


def test_missing_dependency_of_an_installed_implementation(tmp_path, monkeypatch):
    (tmp_path / "fakeimpl_xyz.py").write_text("import missing_dep_xyz\nclass FS: pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(known_implementations, "fakedep",
                        {"class": "fakeimpl_xyz.FS", "err": "broken"})
    with pytest.raises(StorageError, match=r"^fakedep:// needs the missing_dep_xyz package \(needed by "
                                           r"fakeimpl_xyz\): pip install missing_dep_xyz$"):
        storage.resolve("fakedep://x")


def test_url_that_cannot_be_opened():
    with pytest.raises(StorageError, match=r"storage URL 'zip://a::memory://no-such.zip' cannot be opened "
                                           r"\(FileNotFoundError"):
        storage.resolve("zip://a::memory://no-such.zip")


def test_default_storage_path(monkeypatch, tmp_path):
    monkeypatch.delenv(storage.STORAGE_PATH_ENV, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert storage.default_storage_path() == str(tmp_path / "raytrain_nb_results")
    monkeypatch.setenv(storage.STORAGE_PATH_ENV, "~/elsewhere")
    assert storage.default_storage_path() == str(tmp_path / "elsewhere")
    monkeypatch.setenv(storage.STORAGE_PATH_ENV, "s3://bucket/results")
    assert storage.default_storage_path() == "s3://bucket/results"
    monkeypatch.setenv(storage.STORAGE_PATH_ENV, "  ")
    assert storage.default_storage_path() == str(tmp_path / "raytrain_nb_results")


# ---------------------------------------------------------------- checks


def test_check_writable_creates_the_directory(tmp_path, mem_url):
    fs, path = storage.check_writable(tmp_path / "new" / "dir")
    assert os.path.isdir(path) and os.listdir(path) == []
    fs, path = storage.check_writable(mem_url)
    assert fs.ls(path) == []


def test_check_writable_names_path_and_cause(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(StorageError, match=rf"storage path {blocker}/sub is not writable \((FileExistsError|"
                                           rf"NotADirectoryError).*\): pass a writable --storage URL or set "
                                           r"RAYTRAIN_NB_STORAGE_PATH"):
        storage.check_writable(str(blocker / "sub"))


def test_check_writable_catches_a_bad_read_back(mem_url):
    class Liar(MemoryFileSystem):
        def cat_file(self, path, start=None, end=None, **kwargs):
            return b"??"

    with pytest.raises(StorageError, match=r"is not writable \(OSError: the probe file read back different bytes\)"):
        storage.check_writable(mem_url, Liar())


def test_refuse_per_process(tmp_path, mem_url):
    with pytest.raises(StorageError, match=r"memory:///t-.* cannot be a worker group's storage: memory:// lives "
                                           r"inside one process, so workers would not see"):
        storage.refuse_per_process(mem_url)
    assert storage.refuse_per_process(tmp_path)[1] == str(tmp_path)
    assert storage.refuse_per_process("s3://bucket/x")[1] == "bucket/x"


# ---------------------------------------------------------------- small files


def test_write_bytes_atomic_replaces(tmp_path, mem_url):
    target = str(tmp_path / "d" / "f.json")
    storage.write_bytes_atomic(LocalFileSystem(), target, b"one")
    storage.write_bytes_atomic(LocalFileSystem(), target, b"two")
    assert open(target, "rb").read() == b"two" and os.listdir(tmp_path / "d") == ["f.json"]
    fs, path = storage.resolve(mem_url + "/f")
    storage.write_bytes_atomic(fs, path, b"three")
    assert fs.cat_file(path) == b"three"


def test_write_bytes_atomic_keeps_the_old_file_on_failure(tmp_path, monkeypatch):
    target = str(tmp_path / "f.json")
    storage.write_bytes_atomic(LocalFileSystem(), target, b"old")

    def boom(*args):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="No space left"):
        storage.write_bytes_atomic(LocalFileSystem(), target, b"new")
    assert open(target, "rb").read() == b"old" and os.listdir(tmp_path) == ["f.json"]


class Scalar:
    """Stands in for a numpy / torch scalar."""

    def item(self):
        return 0.5


class NoItem:
    def item(self):
        raise ValueError("only one element tensors can be converted")


def test_to_json():
    assert json.loads(storage.to_json({"loss": Scalar(), "n": [1, 2]}, "metrics")) == {"loss": 0.5, "n": [1, 2]}
    with pytest.raises(StorageError, match=r"metrics\['bad'\] cannot be stored as JSON \(a object is not "
                                           r"JSON-serializable\): use str, int"):
        storage.to_json({"ok": 1, "bad": object()}, "metrics")
    with pytest.raises(CheckpointError, match=r"^record cannot be stored as JSON \(a NoItem is not"):
        storage.to_json([NoItem()], "record", error=CheckpointError)


def test_read_json(tmp_path):
    fs = LocalFileSystem()
    path = str(tmp_path / "x.json")
    assert storage.read_json(fs, path, "index", missing_ok=True) is None
    with pytest.raises(StorageError, match=rf"^index {path} does not exist$"):
        storage.read_json(fs, path, "index")
    open(path, "w").write('{"a": [1, 2')
    with pytest.raises(StorageError, match=rf"^index {path} is damaged \(truncated or edited\?\): .*; restore it"):
        storage.read_json(fs, path, "index")
    open(path, "wb").write(b"\xff\xfe")
    with pytest.raises(CheckpointError, match=r"is damaged .*; fix it$"):
        storage.read_json(fs, path, "index", error=CheckpointError, fix="fix it")


# ---------------------------------------------------------------- atomic directories


def test_atomic_dir_commits(run_url):
    staged = committed(run_url, "ckpt_1", {"model.pt": b"12345", "sub/opt.pt": b"678"})
    fs, run = storage.resolve(run_url)
    final = storage.join(run, "ckpt_1")
    assert staged.final_path == final and list_committed(run_url) == ["ckpt_1"]
    assert is_committed(fs, final) and not fs.exists(storage.join(final, WRITING_MARKER))
    manifest = read_manifest(fs, final)
    assert manifest["files"] == {"model.pt": 5, "sub/opt.pt": 3} and manifest["size_bytes"] == 8
    assert verify_dir(fs, final)["model.pt"] == 5
    assert fs.cat_file(storage.join(final, "sub/opt.pt")) == b"678"
    if storage.is_local(fs):  # written under .staging, then renamed
        assert staged.path.startswith(storage.join(run, STAGING_DIR)) and not os.path.exists(staged.path)
        assert os.listdir(storage.join(run, STAGING_DIR)) == []


@pytest.mark.parametrize("error", [RuntimeError("bug in the writer"), OSError(28, "No space left on device"),
                                   KeyboardInterrupt()])
def test_interrupted_write_is_never_listed_and_the_previous_is_untouched(run_url, error):
    committed(run_url, "ckpt_1")
    with pytest.raises(type(error)):
        with atomic_dir(run_url, "ckpt_2") as staged:
            write(staged, "model.pt", b"half")
            raise error
    fs, run = storage.resolve(run_url)
    assert list_committed(run_url) == ["ckpt_1"]
    assert not fs.exists(staged.path) and not fs.exists(staged.final_path)
    assert fs.cat_file(storage.join(run, "ckpt_1", "model.pt")) == b"weights-ckpt_1"
    verify_dir(fs, storage.join(run, "ckpt_1"))


def test_failed_commit_discards_the_staging(run_url, monkeypatch):
    committed(run_url, "ckpt_1")
    fs, run = storage.resolve(run_url)
    if storage.is_local(fs):
        monkeypatch.setattr(staging.os, "rename", lambda *a: (_ for _ in ()).throw(OSError(5, "I/O error")))
    else:
        real = type(fs).pipe_file

        def pipe_file(self, path, value, *args, **kwargs):
            if path.endswith(COMMIT_MARKER):
                raise OSError(5, "I/O error")
            return real(self, path, value, *args, **kwargs)

        monkeypatch.setattr(type(fs), "pipe_file", pipe_file)
    with pytest.raises(CheckpointError, match=r"cannot commit checkpoint .*ckpt_2: OSError: \[Errno 5\] I/O error"):
        with atomic_dir(run_url, "ckpt_2") as staged:
            write(staged, "model.pt")
    monkeypatch.undo()
    assert list_committed(run_url) == ["ckpt_1"] and not fs.exists(staged.path)


@pytest.mark.parametrize("name", ["", ".hidden", "a/b", "../up", "x" * 201, 5, None])
def test_bad_names(run_url, name):
    with pytest.raises(CheckpointError, match=r"checkpoint name .* is not allowed: use letters, digits"):
        begin_dir(run_url, name)


def test_existing_names_are_refused(run_url):
    committed(run_url, "ckpt_1")
    with pytest.raises(CheckpointError, match=r"checkpoint .*ckpt_1 already exists: pick another name or delete"):
        begin_dir(run_url, "ckpt_1")
    fs, run = storage.resolve(run_url)
    fs.makedirs(storage.join(run, "user_dir"), exist_ok=True)
    fs.pipe_file(storage.join(run, "user_dir", "f"), b"x")
    with pytest.raises(CheckpointError, match=r"user_dir already exists and is not a committed checkpoint"):
        begin_dir(run_url, "user_dir")


def test_object_store_leftover_of_the_same_name_is_replaced(mem_url, caplog):
    first = begin_dir(mem_url, "ckpt_1")
    write(first, "stale.pt")  # the writer "died" here
    with caplog.at_level(logging.WARNING):
        committed(mem_url, "ckpt_1")
    fs, path = storage.resolve(mem_url + "/ckpt_1")
    assert "an earlier write of it was interrupted" in caplog.text
    assert sorted(verify_dir(fs, path)) == ["model.pt"]  # the manifest's files only


def test_verify_dir_errors(run_url):
    fs, run = storage.resolve(run_url)
    url = storage.to_url(fs, run)
    with pytest.raises(CheckpointError, match=rf"^checkpoint directory {url}/nope does not exist$"):
        verify_dir(fs, storage.join(run, "nope"))
    partial = begin_dir(run_url, "partial")
    write(partial, "model.pt")
    with pytest.raises(CheckpointError, match=r"was interrupted mid-write \(it has no .committed marker\): load "
                                              r"an earlier checkpoint"):
        verify_dir(fs, partial.path)
    ck = storage.join(run, "ck")
    committed(run_url, "ck", {"a.pt": b"1234", "b.pt": b"5678"})
    fs.pipe_file(storage.join(ck, "a.pt"), b"12")
    with pytest.raises(CheckpointError, match=rf"checkpoint file {url}/ck/a.pt has 2 bytes but had 4 when "
                                              r"committed \(truncated or edited\?\)"):
        verify_dir(fs, ck)
    fs.rm_file(storage.join(ck, "a.pt"))
    with pytest.raises(CheckpointError, match=rf"checkpoint file {url}/ck/a.pt is missing"):
        verify_dir(fs, ck)
    fs.pipe_file(storage.join(ck, COMMIT_MARKER), b'{"name": "ck", "fil')
    with pytest.raises(CheckpointError, match=rf"checkpoint marker {url}/ck/.committed is damaged \(truncated or "
                                              r"edited\?\).*load another one"):
        verify_dir(fs, ck)
    fs.pipe_file(storage.join(ck, COMMIT_MARKER), b'{"name": "ck"}')
    with pytest.raises(CheckpointError, match=r"\.committed is damaged \(no file list\)"):
        verify_dir(fs, ck)


def test_plain_directory_verifies(run_url):
    fs, run = storage.resolve(run_url)
    fs.makedirs(storage.join(run, "mine"), exist_ok=True)
    fs.pipe_file(storage.join(run, "mine", "w.pt"), b"abc")
    assert verify_dir(fs, storage.join(run, "mine")) == {"w.pt": 3}
    assert list_committed(run_url) == []


def test_list_committed_of_a_missing_parent(run_url):
    assert list_committed(run_url + "/missing") == []


def test_delete_dir(run_url):
    committed(run_url, "a")
    committed(run_url, "b")
    fs, run = storage.resolve(run_url)
    delete_dir(fs, storage.join(run, "a"))
    assert list_committed(run_url) == ["b"] and not fs.exists(storage.join(run, "a"))
    assert clean_staging(run_url) == []


def test_discard_dir_never_touches_a_committed_dir(mem_url):
    staged = committed(mem_url, "ck")
    discard_dir(staged)
    assert list_committed(mem_url) == ["ck"]


def test_discard_dir_failure_is_logged(mem_url, monkeypatch, caplog):
    staged = begin_dir(mem_url, "ck")
    monkeypatch.setattr(type(staged.fs), "rm", lambda *a, **k: (_ for _ in ()).throw(PermissionError("denied")))
    with caplog.at_level(logging.WARNING):
        discard_dir(staged)
    assert "could not remove the staging dir" in caplog.text and "PermissionError: denied" in caplog.text


def test_staged_dir_pickles_and_copies_a_local_dir(run_url, tmp_path):
    src = tmp_path / "src"
    (src / "nested").mkdir(parents=True)
    (src / "nested" / "w.pt").write_bytes(b"w")
    (src / ".metadata.json").write_text("{}")
    (src / COMMIT_MARKER).write_text("{}")  # a marker copied from elsewhere is not carried over
    staged = pickle.loads(pickle.dumps(begin_dir(run_url, "ck")))
    staged.put_dir(str(src))
    commit_dir(staged)
    fs, run = storage.resolve(run_url)
    assert read_manifest(fs, staged.final_path)["files"] == {"nested/w.pt": 1}
    assert fs.exists(storage.join(staged.final_path, ".metadata.json"))
    assert staged.final_url.endswith("/ck")


def test_clean_staging(run_url):
    committed(run_url, "ck")
    staged = begin_dir(run_url, "partial")
    write(staged, "model.pt")
    assert clean_staging(run_url, older_than_s=3600) == []  # maybe still being written
    fs, run = storage.resolve(run_url)
    if storage.is_local(fs):  # age it instead of waiting
        for root, _, files in os.walk(staged.path):
            for f in files:
                os.utime(os.path.join(root, f), (1, 1))
        assert clean_staging(run_url, older_than_s=3600) == [staged.path]
    else:
        assert clean_staging(run_url) == [staged.url]
    assert not fs.exists(staged.path) and list_committed(run_url) == ["ck"]
    assert clean_staging(run_url + "/missing") == []


KILLED_WRITER = textwrap.dedent("""
    import sys
    from raytrain_nb._internal.checkpoint.staging import begin_dir
    staged = begin_dir(sys.argv[1], "ckpt_2")
    with staged.open("model.pt") as f:
        f.write(b"x" * 100000)
        f.flush()
        print("WRITING", flush=True)
        sys.stdin.read()  # blocks: killed here, mid-file
""")


def test_sigkill_mid_write(tmp_path):
    run = str(tmp_path / "run")
    committed(run, "ckpt_1")
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, run], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "WRITING"
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdin.close()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    assert list_committed(run) == ["ckpt_1"]
    fs = LocalFileSystem()
    verify_dir(fs, os.path.join(run, "ckpt_1"))
    assert open(os.path.join(run, "ckpt_1", "model.pt"), "rb").read() == b"weights-ckpt_1"
    [leftover] = clean_staging(run)
    assert "/.staging/ckpt_2-" in leftover and not os.path.exists(leftover)
    committed(run, "ckpt_2")  # the name is free again
    assert list_committed(run) == ["ckpt_1", "ckpt_2"]


# ---------------------------------------------------------------- storage-sharing check


def test_storage_check_round_trip(run_url):
    token = storage_check.write_marker(run_url)
    driver = storage_check.read_marker(run_url, token, rank=0)
    assert driver["token"] == token and driver["pid"] == os.getpid()
    storage_check.read_marker(run_url, token, rank=1)
    found = storage_check.collect_markers(run_url, token, ranks=[0, 1])
    assert sorted(found) == [0, 1] and found[1]["rank"] == 1 and found[0]["host"]
    storage_check.clear_markers(run_url, token)
    fs, run = storage.resolve(run_url)
    assert not fs.exists(storage.join(run, storage_check.MARKER_DIR, token))
    storage_check.clear_markers(run_url, token)  # twice is fine


def test_worker_that_cannot_see_the_driver_marker(tmp_path):
    token = storage_check.write_marker(tmp_path / "driver-view")
    elsewhere = tmp_path / "node-2-view"  # the same path on another node: another disk
    with pytest.raises(StorageError, match=rf"the storage check marker {elsewhere}/.storage_check/{token}/driver.json "
                                           r"written by the driver cannot be read on host .* \(rank 3\) "
                                           r"\(FileNotFoundError.*\); a local path on a multi-node cluster is "
                                           r"not shared between nodes"):
        storage_check.read_marker(elsewhere, token, rank=3)


def test_worker_marker_with_another_token(mem_url):
    token = storage_check.write_marker(mem_url)
    fs, run = storage.resolve(mem_url)
    fs.pipe_file(storage.join(run, storage_check.MARKER_DIR, token, "driver.json"), b'{"token": "other"}')
    with pytest.raises(StorageError, match=r"cannot be read on host .* \(ValueError: it holds another token\); "
                                           r"check that every node has the same credentials"):
        storage_check.read_marker(mem_url, token)


def test_driver_that_cannot_see_worker_markers(tmp_path):
    token = storage_check.write_marker(tmp_path)
    storage_check.read_marker(tmp_path, token, rank=0)
    with pytest.raises(StorageError, match=r"the driver on host .* cannot read the storage check markers of "
                                           rf"rank 1, 2 under {tmp_path}/.storage_check/{token} \(FileNotFoundError"
                                           r".*a local path on a multi-node cluster is not shared"):
        storage_check.collect_markers(tmp_path, token, ranks=[0, 1, 2])


def test_marker_write_failures(tmp_path, mem_url):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StorageError, match=rf"cannot write the storage check marker {blocker}/.storage_check/.*"
                                           r"driver.json \(.*Error.*\): pass a writable --storage URL"):
        storage_check.write_marker(blocker)

    class ReadOnlyForWorkers(MemoryFileSystem):
        def pipe_file(self, path, value, *args, **kwargs):
            if "rank-" in path:
                raise PermissionError("read-only mount")
            return super().pipe_file(path, value, *args, **kwargs)

    token = storage_check.write_marker(mem_url)
    with pytest.raises(StorageError, match=r"cannot write the storage check marker .*rank-2.json on host .* "
                                           r"\(rank 2\) \(PermissionError: read-only mount\): the storage must be "
                                           r"writable from every worker"):
        storage_check.read_marker(mem_url, token, rank=2, filesystem=ReadOnlyForWorkers())
