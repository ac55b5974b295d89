"""No file in storage is trusted: what a run directory holds never makes us write outside a destination,
delete outside the run or unpickle code (no Ray)."""
from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys

import pytest

from raytrain_nb._internal.checkpoint import staging, storage
from raytrain_nb._internal.checkpoint.checkpoint import Checkpoint
from raytrain_nb._internal.checkpoint.manager import INDEX_FILE, CheckpointManager
from raytrain_nb._internal.checkpoint.metrics_log import METRICS_FILE, append_metrics, read_metrics
from raytrain_nb._internal.checkpoint.staging import (COMMIT_MARKER, STAGING_DIR, WRITING_MARKER, atomic_dir, begin_dir,
                                                      clean_leftovers, list_committed, read_manifest)
from raytrain_nb._internal.checkpoint.storage import check_run_name
from raytrain_nb._internal.errors import CheckpointError


def committed(url, name, files=None):
    """A committed directory ``url/name`` holding ``files`` (``{relative path: bytes}``)."""
    with atomic_dir(url, name) as staged:
        for rel, data in (files or {"model.pt": b"weights"}).items():
            with staged.open(rel) as f:
                f.write(data)
    return staged


def tree(root):
    """Every file under ``root``, relative, sorted."""
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, fs in os.walk(root) for f in fs)


# ---------------------------------------------------------------- copying a checkpoint out


def test_only_the_manifest_files_are_copied(mem_url, tmp_path, caplog):
    staged = committed(mem_url, "ck", {"model.pt": b"weights", "sub/opt.pt": b"opt"})
    fs = staged.fs
    fs.pipe_file(storage.join(staged.final_path, "extra.bin"), b"planted")
    fs.pipe_file(staged.final_path + "/../../../../evil.txt", b"evil")  # a key, not a path
    dest = tmp_path / "outside" / "a" / "b" / "c" / "dest"
    with caplog.at_level(logging.DEBUG, logger=staging.__name__.rsplit(".", 1)[0]):
        assert Checkpoint(staged.final_url).to_directory(dest) == str(dest)
    assert tree(tmp_path) == ["outside/a/b/c/dest/model.pt", "outside/a/b/c/dest/sub/opt.pt"]
    assert "extra.bin" in caplog.text


def test_a_manifest_naming_a_file_outside_is_refused(mem_url, tmp_path):
    staged = committed(mem_url, "ck")
    fs, path = staged.fs, staged.final_path
    fs.pipe_file(path + "/../../evil.txt", b"evil")
    manifest = read_manifest(fs, path)
    manifest["files"]["../../evil.txt"] = 4
    fs.pipe_file(storage.join(path, COMMIT_MARKER), json.dumps(manifest).encode())
    dest = tmp_path / "x" / "y" / "dest"
    with pytest.raises(CheckpointError, match=r"^checkpoint .*/ck lists the file '\.\./\.\./evil\.txt', which "
                                              r"is absolute or leaves the checkpoint .*load another one$"):
        Checkpoint(staged.final_url).to_directory(dest)
    assert tree(tmp_path) == []
    manifest["files"] = {"/etc/evil": 4}
    fs.pipe_file(storage.join(path, COMMIT_MARKER), json.dumps(manifest).encode())
    with pytest.raises(CheckpointError, match=r"lists the file '/etc/evil', which is absolute"):
        Checkpoint(staged.final_url).to_directory(dest)


def test_a_plain_directory_with_a_name_outside_is_refused(mem_url, tmp_path, monkeypatch):
    fs, root = storage.resolve(mem_url)
    fs.pipe_file(root + "/plain/w.pt", b"w")
    fs.pipe_file(root + "/plain/../../../evil.txt", b"evil")
    deep = tmp_path / "t1" / "t2" / "t3" / "tmp"
    deep.mkdir(parents=True)
    monkeypatch.setattr("tempfile.tempdir", str(deep))
    with pytest.raises(CheckpointError, match=r"lists the file '\.\./\.\./\.\./evil\.txt'"):
        Checkpoint(mem_url + "/plain").to_directory(tmp_path / "a" / "b" / "dest")
    with pytest.raises(CheckpointError, match=r"lists the file '\.\./\.\./\.\./evil\.txt'"):
        with Checkpoint(mem_url + "/plain").as_directory():
            pass
    assert tree(tmp_path) == [] and os.listdir(deep) == []


def test_a_link_in_the_destination_is_refused(mem_url, tmp_path):
    staged = committed(mem_url, "ck", {"sub/f.pt": b"f"})
    (tmp_path / "elsewhere").mkdir()
    dest = tmp_path / "dest"
    dest.mkdir()
    os.symlink(tmp_path / "elsewhere", dest / "sub")
    elsewhere = os.path.realpath(tmp_path / "elsewhere")
    with pytest.raises(CheckpointError, match=r"^checkpoint .*/ck: the file 'sub/f\.pt' would be written to "
                                              rf"{elsewhere}/f\.pt, outside the destination {dest}: "):
        Checkpoint(staged.final_url).to_directory(dest)
    assert os.listdir(tmp_path / "elsewhere") == []


# ---------------------------------------------------------------- the index and pruning


def save(mgr, kind="reported", metrics=None):
    staged = mgr.begin(kind)
    with staged.open("model.pt") as f:
        f.write(b"weights")
    return mgr.commit(staged, kind, metrics)


def entry(name, path, acc=-1.0):
    return {"name": name, "kind": "reported", "path": path, "metrics": {"acc": acc}, "step": None,
            "time": 1.0, "size_bytes": 7}


def plant(run, *entries):
    """Add raw entries to the index of ``run`` (a local path)."""
    index = os.path.join(run, INDEX_FILE)
    data = json.load(open(index))
    data["checkpoints"] = list(entries) + data["checkpoints"]
    with open(index, "w") as f:
        json.dump(data, f)


def test_index_entries_outside_the_run_are_skipped_and_never_deleted(tmp_path, caplog):
    other = CheckpointManager(tmp_path / "other-run")
    victim = save(other)
    run = str(tmp_path / "run")
    mgr = CheckpointManager(run, num_to_keep=1, score_attribute="acc")
    save(mgr, metrics={"acc": 1.0})
    plant(run, entry("up", "../other-run/" + victim.name), entry("abs", victim.path),
          entry("url", "file://" + victim.path), entry("deep", "a/" + victim.name), entry("dot", "."),
          entry("hidden", STAGING_DIR))
    with caplog.at_level(logging.WARNING):
        mgr = CheckpointManager.load(run)
    assert [e.name for e in mgr.list()] == ["checkpoint_000001"]
    for name, path in [("up", "../other-run/" + victim.name), ("abs", victim.path), ("deep", "a/")]:
        assert f"entry {name!r}" in caplog.text and path in caplog.text
    for _ in range(3):  # registering prunes; nothing outside the run is touched
        save(mgr, metrics={"acc": 2.0})
    assert list_committed(tmp_path / "other-run") == [victim.name]
    assert read_manifest(*storage.resolve(victim.path)) is not None
    assert [e["name"] for e in json.load(open(os.path.join(run, INDEX_FILE)))["checkpoints"]] == \
        [e.name for e in mgr.list()]
    assert all(not e["path"].startswith(("/", ".")) for e in json.load(open(os.path.join(run, INDEX_FILE)))
               ["checkpoints"])


def test_bad_entries_are_named_and_skipped_not_raised(run_url, caplog):
    mgr = CheckpointManager(run_url)
    save(mgr)
    fs, run = storage.resolve(run_url)
    index = storage.join(run, INDEX_FILE)
    data = json.loads(fs.cat_file(index))
    data["checkpoints"] += [3, {**data["checkpoints"][0], "name": "k", "kind": "bogus"},
                            {**data["checkpoints"][0], "name": "s", "size_bytes": "big"},
                            {**data["checkpoints"][0], "name": "p", "path": 7}]
    fs.pipe_file(index, json.dumps(data).encode())
    with caplog.at_level(logging.WARNING):
        back = CheckpointManager(run_url)
    assert [e.name for e in back.list()] == ["checkpoint_000001"]
    for text in ("entry 1 is not an object", "entry 'k' has kind='bogus'", "entry 's' has size_bytes='big'",
                 "entry 'p' has path=7"):
        assert text in caplog.text
    save(back)
    assert len(json.loads(fs.cat_file(index))["checkpoints"]) == 2  # dropped on the next write


def test_a_directory_without_our_manifest_is_never_deleted(run_url, caplog):
    mgr = CheckpointManager(run_url, num_to_keep=1)
    first = save(mgr)
    snap = save(mgr, "snapshot")
    fs, run = storage.resolve(run_url)
    for e in (first, snap):  # replaced by a user's directory of the same name
        fs.rm_file(storage.join(run, e.name, COMMIT_MARKER))
    with caplog.at_level(logging.WARNING):
        save(mgr)
        mgr.delete(snap.name)
    assert fs.exists(storage.join(run, first.name, "model.pt")) and fs.exists(storage.join(run, snap.name))
    assert f"{first.name}" in caplog.text and "has no commit manifest" in caplog.text
    assert [e.name for e in mgr.list()] == ["checkpoint_000003"]


def test_register_refuses_a_path_outside_the_run(run_url, tmp_path):
    outside = committed(str(tmp_path / "elsewhere"), "ck")
    mgr = CheckpointManager(run_url)
    with pytest.raises(CheckpointError, match=r"^checkpoint .*elsewhere/ck is not a directory directly inside the "
                                              r"run .*: copy it in with persist\(\)"):
        mgr.register("outside", "snapshot", "file://" + outside.final_path)
    assert mgr.list() == []


# ---------------------------------------------------------------- run names


@pytest.mark.parametrize("name", ["", "../x", "..", "/abs", "a/b", "a\\b", ".hidden", "sp ace", "ü", "x" * 201,
                                  None, 3, "a\x00b"])
def test_bad_run_names_are_refused(name):
    with pytest.raises(CheckpointError, match=r"^run name .* (is not allowed: use letters, digits and _ \. = \+ - "
                                              r"\(no '/' or '\.\.', not starting with '\.'\), e\.g\. --name my-run|"
                                              r"is not a string: .*--name my-run|is empty: .*--name my-run|"
                                              r"is 201 characters long: .*--name my-run)$"):
        check_run_name(name)


@pytest.mark.parametrize("name", ["my-run", "r1", "lr=0.1+bs=32", "a..b", "_x", "x" * 200, "-x"])
def test_good_run_names_pass(name):
    assert check_run_name(name) is None


# ---------------------------------------------------------------- metrics.jsonl


def test_a_torn_middle_line_is_skipped_and_named(run_url, caplog):
    append_metrics(run_url, {"step": 1})
    fs, run = storage.resolve(run_url)
    path = storage.join(run, METRICS_FILE)
    fs.pipe_file(path, fs.cat_file(path) + b'{"step": 2, "lo\n[1, 2]\n{"step": 3}\n')
    with caplog.at_level(logging.WARNING):
        assert read_metrics(run_url) == [{"step": 1}, {"step": 3}]
    assert f"{storage.to_url(fs, path)} line 2" in caplog.text and "line 3" in caplog.text


def test_an_append_after_a_torn_last_line_starts_a_new_line(run_url, caplog):
    append_metrics(run_url, {"step": 1})
    fs, run = storage.resolve(run_url)
    path = storage.join(run, METRICS_FILE)
    fs.pipe_file(path, fs.cat_file(path) + b'{"step": 2, "lo')
    append_metrics(run_url, {"step": 3})
    append_metrics(run_url, [{"step": 4}])
    with caplog.at_level(logging.WARNING):
        assert read_metrics(run_url) == [{"step": 1}, {"step": 3}, {"step": 4}]
    assert "line 2" in caplog.text


# ---------------------------------------------------------------- leftovers


def interrupted(run_url, name, host, pid):
    """A staged write whose ``.writing`` marker names ``host`` and ``pid``."""
    staged = begin_dir(run_url, name)
    with staged.open("model.pt") as f:
        f.write(b"half")
    staged.fs.pipe_file(storage.join(staged.path, WRITING_MARKER),
                        json.dumps({"name": name, "host": host, "pid": pid, "started": 0}).encode())
    return staged


def dead_pid():
    """The pid of a process of this host that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait(timeout=60)
    return proc.pid


def test_clean_leftovers(run_url, monkeypatch, caplog):
    committed(run_url, "ck")
    dead = interrupted(run_url, "dead", socket.gethostname(), dead_pid()).url
    alive = begin_dir(run_url, "alive")  # this process: still writing
    far = interrupted(run_url, "far", "elsewhere", os.getpid())
    garbled = begin_dir(run_url, "garbled")
    garbled.fs.pipe_file(storage.join(garbled.path, WRITING_MARKER), b"{not json")
    fs, run = storage.resolve(run_url)
    user = storage.join(run, "user_dir")
    fs.makedirs(user, exist_ok=True)
    fs.pipe_file(storage.join(user, "f"), b"mine")  # no marker: a user's directory, never ours
    expected = [dead]
    if storage.is_local(fs):
        tomb = storage.join(run, STAGING_DIR, "deleting-old-1234abcd")
        fs.makedirs(tomb, exist_ok=True)
        fs.pipe_file(storage.join(tomb, "model.pt"), b"x")
        expected.append(tomb)
    with caplog.at_level(logging.INFO):
        assert sorted(clean_leftovers(run_url)) == sorted(expected)
    assert all(u in caplog.text for u in expected)
    assert not fs.exists(storage.resolve(dead)[1])
    assert all(fs.exists(s.path) for s in (alive, far, garbled)) and fs.exists(user)
    monkeypatch.setattr(staging, "LEFTOVER_AGE_S", 0.0)  # as if an hour went by
    assert sorted(clean_leftovers(run_url)) == sorted([far.url, garbled.url])
    assert fs.exists(alive.path) and fs.exists(user) and list_committed(run_url) == ["ck"]
    assert socket.gethostname() in fs.cat_file(storage.join(alive.path, WRITING_MARKER)).decode()
    assert clean_leftovers(run_url + "/missing") == []
