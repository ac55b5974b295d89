"""CheckpointManager and the metrics log: index, ranking, pruning, reloading (no Ray)."""
from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

from raytrain_nb._internal.checkpoint import manager as cm
from raytrain_nb._internal.checkpoint import storage
from raytrain_nb._internal.checkpoint.checkpoint import Checkpoint
from raytrain_nb._internal.checkpoint.index import list_runs
from raytrain_nb._internal.checkpoint.manager import CheckpointManager
from raytrain_nb._internal.checkpoint.metrics_log import METRICS_FILE, append_metrics, read_metrics
from raytrain_nb._internal.checkpoint.staging import atomic_dir, list_committed
from raytrain_nb._internal.errors import CheckpointError


def save(mgr, kind="reported", metrics=None, name=None, data=b"weights"):
    staged = mgr.begin(kind, name)
    with staged.open("model.pt") as f:
        f.write(data)
    return mgr.commit(staged, kind, metrics)


def names(entries):
    return [e.name for e in entries]


# ---------------------------------------------------------------- arguments


@pytest.mark.parametrize("value", [0, -1, 1.5, True, "2"])
def test_num_to_keep_is_validated(run_url, value):
    with pytest.raises(CheckpointError, match=rf"^num_to_keep={value!r} is not allowed: pass None to keep every "
                                              r"checkpoint, or a whole number >= 1$"):
        CheckpointManager(run_url, num_to_keep=value)


def test_score_order_is_validated(run_url):
    with pytest.raises(CheckpointError, match=r"^score_order='up' is unknown: use 'max' or 'min'$"):
        CheckpointManager(run_url, score_order="up")


@pytest.mark.parametrize("value", ["", 3])
def test_score_attribute_is_validated(run_url, value):
    with pytest.raises(CheckpointError, match=rf"^score_attribute={value!r} is not allowed: pass a metric name"):
        CheckpointManager(run_url, score_attribute=value)


def test_kind_is_validated(run_url):
    mgr = CheckpointManager(run_url)
    for call in (lambda: mgr.begin("final"), lambda: mgr.list("final"), lambda: mgr.next_name("final"),
                 lambda: mgr.register("x", "final", "/x")):
        with pytest.raises(CheckpointError, match=r"^kind='final' is unknown: use 'snapshot' or 'reported'$"):
            call()


# ---------------------------------------------------------------- registering and listing


def test_register_list_get(run_url):
    mgr = CheckpointManager(run_url)
    assert mgr.list() == [] and mgr.latest() is None and len(mgr) == 0
    a = save(mgr, "reported", {"step": 5, "loss": 0.5})
    b = save(mgr, "snapshot", data=b"12")
    c = save(mgr, "reported", {"training_iteration": 7})
    assert names(mgr.list()) == ["checkpoint_000001", "snapshot_000002", "checkpoint_000003"]
    assert names(mgr.list("snapshot")) == ["snapshot_000002"] and mgr.latest("reported") is c
    assert (a.kind, a.step, a.metrics, a.size_bytes) == ("reported", 5, {"step": 5, "loss": 0.5}, 7)
    assert (b.step, b.size_bytes, c.step) == (None, 2, 7) and a.time <= b.time <= c.time
    assert mgr.get("snapshot_000002") is b and mgr.get(0) is a and mgr.get(-1) is c and mgr.latest() is c
    fs, run = storage.resolve(run_url)
    assert a.path == storage.to_url(fs, storage.join(run, a.name))
    with a.checkpoint.as_directory() as d:
        assert open(os.path.join(d, "model.pt"), "rb").read() == b"weights"
    assert list_committed(run_url) == sorted(names(mgr.list()))


def test_get_unknown(run_url):
    mgr = CheckpointManager(run_url)
    with pytest.raises(CheckpointError, match=r"no checkpoint named 'x' in .*run: the run has no checkpoints yet$"):
        mgr.get("x")
    save(mgr)
    save(mgr, "snapshot")
    with pytest.raises(CheckpointError, match=r"^no checkpoint named 'x' in .*run: the run has checkpoint_000001, "
                                              r"snapshot_000002$"):
        mgr.get("x")
    with pytest.raises(CheckpointError, match=r"^checkpoint index 2 is out of range: the run has checkpoint_000001, "):
        mgr.get(2)
    with pytest.raises(CheckpointError, match=r"^checkpoint index -3 is out of range"):
        mgr.get(-3)
    with pytest.raises(CheckpointError, match=r"^no checkpoint named True"):
        mgr.get(True)


def test_register_errors(run_url, tmp_path):
    mgr = CheckpointManager(run_url)
    save(mgr, name="mine")
    with pytest.raises(CheckpointError, match=r"^a checkpoint named 'mine' exists in .*: pick another name or delete"):
        mgr.begin("reported", "mine")
    with pytest.raises(CheckpointError, match=r"^name='' is not allowed: pass a non-empty string$"):
        mgr.register("", "reported", "/x")
    fs, run = storage.resolve(run_url)
    fs.makedirs(storage.join(run, "plain"), exist_ok=True)
    with pytest.raises(CheckpointError, match=rf"^{storage.to_url(fs, run)}/plain is not a committed checkpoint: "
                                              r"write it with begin\(\)/commit\(\) or persist\(\)$"):
        mgr.register("plain", "reported", storage.to_url(fs, storage.join(run, "plain")))
    (tmp_path / "elsewhere").mkdir()
    with pytest.raises(CheckpointError, match=rf"^checkpoint {tmp_path}/elsewhere is not a directory directly "
                                              r"inside the run .*: copy it in with persist\(\), which registers "
                                              r"the copy$"):
        mgr.register("elsewhere", "reported", f"file://{tmp_path}/elsewhere")
    with pytest.raises(CheckpointError, match=r"^metrics\['bad'\] cannot be stored as JSON"):
        save(mgr, metrics={"bad": object()})
    assert names(mgr.list()) == ["mine"]


def test_a_checkpoint_written_elsewhere_is_copied_in(run_url, tmp_path):
    with atomic_dir(tmp_path / "elsewhere", "ck") as staged:
        with staged.open("w") as f:
            f.write(b"w")
    mgr = CheckpointManager(run_url)
    with pytest.raises(CheckpointError, match=r"is not a directory directly inside the run .*persist\(\)"):
        mgr.register("outside", "snapshot", f"file://{staged.final_path}", {"acc": 1})
    entry = mgr.persist(f"file://{staged.final_path}", "snapshot", {"acc": 1}, name="outside")
    reloaded = CheckpointManager.load(run_url).get("outside")
    assert reloaded.path == entry.path == f"{mgr.run_dir}/outside"
    assert reloaded.checkpoint.get_metadata() == {} and reloaded.size_bytes == 1


def test_next_name_skips_names_in_use(run_url):
    mgr = CheckpointManager(run_url)
    save(mgr, name="checkpoint_000001")
    assert mgr.next_name("reported") == "checkpoint_000002" and mgr.next_name("snapshot") == "snapshot_000003"


def test_persist(run_url, tmp_path, mem_url):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "w.pt").write_bytes(b"abc")
    mgr = CheckpointManager(run_url)
    local = mgr.persist(str(src), "reported", {"acc": 0.5})
    Checkpoint(local.path).set_metadata({"from": "local"})
    copied = mgr.persist(local.checkpoint, "snapshot", name="copy")
    assert copied.size_bytes == 3 and Checkpoint(copied.path).get_metadata() == {"from": "local"}
    with pytest.raises(CheckpointError, match=r"checkpoint directory .*missing does not exist"):
        mgr.persist(mem_url + "/missing")
    fs, run = storage.resolve(run_url)
    assert names(mgr.list()) == [local.name, "copy"] and list_committed(run_url) == sorted([local.name, "copy"])
    assert storage.is_local(fs) is False or os.listdir(os.path.join(run, ".staging")) == []


def test_abort_and_failed_commit(run_url, monkeypatch):
    mgr = CheckpointManager(run_url)
    staged = mgr.begin("snapshot")
    mgr.abort(staged)
    monkeypatch.setattr(cm, "commit_dir", lambda s: (_ for _ in ()).throw(OSError(28, "No space left on device")))
    staged = mgr.begin("snapshot")
    with pytest.raises(OSError, match="No space left"):
        mgr.commit(staged, "snapshot")
    fs, _ = storage.resolve(run_url)
    assert mgr.list() == [] and list_committed(run_url) == [] and not fs.exists(staged.path)


# ---------------------------------------------------------------- ranking and pruning


def test_num_to_keep_by_score_keeps_the_best_and_the_latest(run_url):
    mgr = CheckpointManager(run_url, num_to_keep=2, score_attribute="acc")
    for acc in (0.5, 0.9, 0.1):
        save(mgr, metrics={"acc": acc})
    # 0.1 is the worst but the latest: kept (as in Ray Train)
    assert [e.metrics["acc"] for e in mgr.list()] == [0.5, 0.9, 0.1]
    save(mgr, metrics={"acc": 0.7})
    assert [e.metrics["acc"] for e in mgr.list()] == [0.9, 0.7]
    assert list_committed(run_url) == sorted(names(mgr.list()))
    assert [e.metrics["acc"] for e in mgr.best(5)] == [0.9, 0.7]


def test_score_order_min_and_nested_attributes(run_url):
    mgr = CheckpointManager(run_url, num_to_keep=1, score_attribute="val/loss", score_order="min")
    save(mgr, metrics={"val": {"loss": 0.3}})
    save(mgr, metrics={"val": {"loss": 0.1}})
    save(mgr, metrics={"val": {"loss": 0.2}})  # latest: kept beside the best
    assert [e.metrics["val"]["loss"] for e in mgr.list()] == [0.1, 0.2]
    assert mgr.best(1)[0].metrics == {"val": {"loss": 0.1}}


def test_entries_lacking_the_score_rank_lowest(run_url):
    mgr = CheckpointManager(run_url, num_to_keep=2, score_attribute="acc")
    for metrics in ({"acc": 0.2}, {"loss": 1.0}, {"acc": float("nan")}, {"acc": "high"}, {"acc": 0.1}):
        save(mgr, metrics=metrics)
    assert [e.metrics for e in mgr.list()] == [{"acc": 0.2}, {"acc": 0.1}]


def test_snapshots_are_never_pruned(run_url):
    mgr = CheckpointManager(run_url, num_to_keep=1, score_attribute="acc")
    snap = save(mgr, "snapshot", {"acc": 0.0})
    for acc in (0.3, 0.2, 0.1):
        save(mgr, metrics={"acc": acc})
    save(mgr, "snapshot")
    assert names(mgr.list("snapshot")) == [snap.name, "snapshot_000005"]
    assert [e.metrics["acc"] for e in mgr.list("reported")] == [0.3, 0.1]
    assert names(mgr.best(3)) == [mgr.list("reported")[0].name, mgr.list("reported")[1].name]


def test_without_a_score_the_most_recent_are_kept(run_url):
    mgr = CheckpointManager(run_url, num_to_keep=2)
    for i in range(4):
        save(mgr, metrics={"step": i})
    assert [e.step for e in mgr.list()] == [2, 3] and [e.step for e in mgr.best(2)] == [3, 2]


def test_best_validates_n(run_url):
    with pytest.raises(CheckpointError, match=r"^n=0 is not allowed: pass a whole number >= 1$"):
        CheckpointManager(run_url).best(0)


def test_a_failed_delete_of_a_pruned_checkpoint_is_logged(run_url, monkeypatch, caplog):
    mgr = CheckpointManager(run_url, num_to_keep=1)
    save(mgr)
    monkeypatch.setattr(cm, "delete_dir", lambda fs, p: (_ for _ in ()).throw(PermissionError("denied")))
    with caplog.at_level(logging.WARNING):
        save(mgr)
    assert names(mgr.list()) == ["checkpoint_000002"]
    assert "could not delete checkpoint" in caplog.text and "PermissionError: denied" in caplog.text


def test_delete(run_url):
    mgr = CheckpointManager(run_url, num_to_keep=1)
    snap = save(mgr, "snapshot")
    rep = save(mgr)
    mgr.delete(snap.name)
    assert names(mgr.list()) == [rep.name] and list_committed(run_url) == [rep.name]
    assert names(CheckpointManager.load(run_url).list()) == [rep.name]
    with pytest.raises(CheckpointError, match=rf"^no checkpoint named 'snapshot_000001' in .*: the run has "
                                              rf"{rep.name}$"):
        mgr.delete(snap.name)


# ---------------------------------------------------------------- persistence


def test_load_restores_entries_and_settings(run_url):
    mgr = CheckpointManager(run_url, num_to_keep=3, score_attribute="acc", score_order="min")
    save(mgr, metrics={"acc": 1, "step": 1})
    save(mgr, "snapshot")
    back = CheckpointManager.load(run_url)
    assert (back.num_to_keep, back.score_attribute, back.score_order) == (3, "acc", "min")
    assert [(e.name, e.kind, e.metrics, e.step, e.size_bytes, e.path, e.time) for e in back.list()] == \
        [(e.name, e.kind, e.metrics, e.step, e.size_bytes, e.path, e.time) for e in mgr.list()]
    assert back.next_name("reported") == "checkpoint_000003"  # numbering continues
    assert "checkpoints=2" in repr(back)
    again = CheckpointManager(run_url, num_to_keep=1)  # a restarted group continues the run
    assert len(again) == 2 and again.num_to_keep == 1


def test_load_in_a_new_process(tmp_path):
    run = str(tmp_path / "run")
    mgr = CheckpointManager(run, num_to_keep=2, score_attribute="acc")
    save(mgr, metrics={"acc": 0.4})
    save(mgr, "snapshot")
    script = textwrap.dedent("""
        import sys
        from raytrain_nb._internal.checkpoint.manager import CheckpointManager
        mgr = CheckpointManager.load(sys.argv[1])
        with mgr.get(0).checkpoint.as_directory() as d:
            data = open(d + "/model.pt", "rb").read()
        print(",".join(e.name for e in mgr.list()), mgr.best(1)[0].metrics["acc"], data.decode())
    """)
    out = subprocess.run([sys.executable, "-c", script, run], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["checkpoint_000001,snapshot_000002", "0.4", "weights"]


def test_a_moved_run_still_loads(tmp_path):
    mgr = CheckpointManager(tmp_path / "a" / "run")
    save(mgr, data=b"moved")
    shutil.move(str(tmp_path / "a"), str(tmp_path / "b"))
    entry = CheckpointManager.load(tmp_path / "b" / "run").latest()
    assert entry.path == str(tmp_path / "b" / "run" / entry.name)
    assert open(os.path.join(entry.checkpoint.to_directory(tmp_path / "out"), "model.pt"), "rb").read() == b"moved"


def test_load_without_an_index(tmp_path):
    CheckpointManager(tmp_path / "run_a").persist(_src(tmp_path))
    CheckpointManager(tmp_path / "run_b").persist(_src(tmp_path))
    with pytest.raises(CheckpointError, match=rf"^no checkpoint index {tmp_path}/typo/checkpoints.json: the run has "
                                              r"no checkpoints yet or is not a run directory; runs next to it: "
                                              r"run_a, run_b$"):
        CheckpointManager.load(tmp_path / "typo")
    with pytest.raises(CheckpointError, match=r"is not a run directory$"):
        CheckpointManager.load(tmp_path / "nowhere" / "typo")
    assert list_runs(tmp_path) == ["run_a", "run_b"] and list_runs(tmp_path / "nowhere") == []


def _src(tmp_path):
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    (src / "w").write_bytes(b"w")
    return str(src)


def _index(run_url):
    fs, run = storage.resolve(run_url)
    return fs, storage.join(run, cm.INDEX_FILE)


@pytest.mark.parametrize("damage, message", [
    (lambda text: text[: len(text) // 2], r"checkpoint index .*checkpoints.json is damaged \(truncated or edited\?\)"),
    (lambda text: "", r"checkpoint index .*checkpoints.json is damaged"),
    (lambda text: "[]", r"checkpoint index .*checkpoints.json is not a format-1 index \(edited by hand\?\)"),
    (lambda text: text.replace('"format": 1', '"format": 7'), r"is not a format-1 index"),
    (lambda text: text.replace('"checkpoints": [', '"checkpoints": {"x": [').replace("]\n}", "]}\n}"),
     r"checkpoints.json has no checkpoint list \(edited by hand\?\): restore it"),
])
def test_damaged_index_is_never_half_loaded(run_url, damage, message):
    mgr = CheckpointManager(run_url)
    save(mgr, metrics={"acc": 1})
    fs, index = _index(run_url)
    text = fs.cat_file(index).decode()
    fs.pipe_file(index, damage(text).encode())
    with pytest.raises(CheckpointError, match=message):
        CheckpointManager.load(run_url)
    with pytest.raises(CheckpointError, match=message):
        CheckpointManager(run_url)


@pytest.mark.parametrize("damage, message", [
    (lambda text: text.replace('"kind": "reported"', '"kind": "bogus"'),
     r"checkpoints.json: entry 'checkpoint_000001' has kind='bogus', which is not valid (edited by hand?): skipped"),
    (lambda text: text.replace('"size_bytes": 7', '"size_bytes": -7'), r"entry 'checkpoint_000001' has size_bytes=-7"),
    (lambda text: json.dumps({**json.loads(text), "checkpoints": [3]}), r"entry 0 is not an object"),
    (lambda text: text.replace('"path": "checkpoint_000001"', '"path": "../x"'), r"has path='../x', which is not"),
])
def test_a_damaged_entry_is_skipped_with_a_warning(run_url, damage, message, caplog):
    mgr = CheckpointManager(run_url)
    save(mgr, metrics={"acc": 1})
    fs, index = _index(run_url)
    fs.pipe_file(index, damage(fs.cat_file(index).decode()).encode())
    with caplog.at_level(logging.WARNING):
        assert CheckpointManager.load(run_url).list() == []
    assert message in caplog.text and "no file is deleted" in caplog.text
    assert list_committed(run_url) == ["checkpoint_000001"]


def test_damaged_settings_in_the_index(run_url):
    save(CheckpointManager(run_url, score_attribute="acc"))
    fs, index = _index(run_url)
    fs.pipe_file(index, fs.cat_file(index).replace(b'"score_order": "max"', b'"score_order": "up"'))
    with pytest.raises(CheckpointError, match=r"^checkpoint index .*checkpoints.json: score_order='up' is unknown: "
                                              r"use 'max' or 'min' \(edited by hand\?\): restore it$"):
        CheckpointManager.load(run_url)


def test_a_crash_while_writing_the_index_keeps_the_old_one(tmp_path, monkeypatch):
    mgr = CheckpointManager(tmp_path)
    first = save(mgr)
    real = cm.write_bytes_atomic

    def crash_mid_index_write(fs, path, data):
        with monkeypatch.context() as m:
            m.setattr(storage.os, "replace", lambda *a: (_ for _ in ()).throw(OSError(28, "No space left")))
            real(fs, path, data)

    monkeypatch.setattr(cm, "write_bytes_atomic", crash_mid_index_write)
    with pytest.raises(CheckpointError, match=rf"^cannot write the checkpoint index {tmp_path}/checkpoints.json "
                                              r"\(OSError: \[Errno 28\] No space left\): the index on storage is "
                                              r"unchanged"):
        save(mgr)
    assert names(mgr.list()) == [first.name]  # the manager did not change either
    with pytest.raises(CheckpointError, match="cannot write the checkpoint index"):
        mgr.delete(first.name)
    assert names(mgr.list()) == [first.name]
    monkeypatch.undo()
    assert names(CheckpointManager.load(tmp_path).list()) == [first.name]
    assert not [f for f in os.listdir(tmp_path) if ".tmp-" in f]


# ---------------------------------------------------------------- metrics log


def test_metrics_log(run_url):
    assert read_metrics(run_url) == []

    class Scalar:
        def item(self):
            return 1.5

    append_metrics(run_url, {"step": 1, "loss": Scalar()})
    append_metrics(run_url, {"step": 2, "loss": 0.5, "checkpoint": "checkpoint_000001"})
    assert read_metrics(run_url) == [{"step": 1, "loss": 1.5}, {"step": 2, "loss": 0.5,
                                                                "checkpoint": "checkpoint_000001"}]


def test_metrics_log_errors(run_url):
    with pytest.raises(CheckpointError, match=r"^record=7 is not a dict: pass the reported metrics$"):
        append_metrics(run_url, 7)
    with pytest.raises(CheckpointError, match=r"^metrics\['t'\] cannot be stored as JSON"):
        append_metrics(run_url, {"t": object()})
    assert read_metrics(run_url) == []


def test_metrics_log_with_a_cut_last_line(run_url, caplog):
    append_metrics(run_url, {"step": 1})
    fs, run = storage.resolve(run_url)
    path = storage.join(run, METRICS_FILE)
    fs.pipe_file(path, fs.cat_file(path) + b'{"step": 2, "lo')
    with caplog.at_level(logging.WARNING):
        assert read_metrics(run_url) == [{"step": 1}]
    assert "it was cut short" in caplog.text


@pytest.mark.parametrize("bad", [b'{"step": 2, "lo\n', b"[1, 2]\n"])
def test_metrics_log_with_a_damaged_line(run_url, bad, caplog):
    append_metrics(run_url, {"step": 1})
    fs, run = storage.resolve(run_url)
    path = storage.join(run, METRICS_FILE)
    fs.pipe_file(path, fs.cat_file(path) + bad + b'{"step": 3}\n')
    with caplog.at_level(logging.WARNING):
        assert read_metrics(run_url) == [{"step": 1}, {"step": 3}]
    assert f"metrics file {storage.to_url(fs, path)} line 2 skipped: it is damaged (" in caplog.text
    assert "fix or delete that line" in caplog.text
