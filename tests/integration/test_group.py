"""WorkerGroup on a real local Ray instance: cells, values, output, moving values, errors."""
from __future__ import annotations

import threading
import time

import pytest

from raytrain_nb import GroupError, ResourceError, WorkerError, WorkerGroup
from raytrain_nb._internal.output import CollectSink

from ..groups import STEP, assert_ranks_identical, rank_params


class TimedSink(CollectSink):
    def __init__(self):
        super().__init__()
        self.times = []

    def stream(self, rank, name, text, label):
        super().stream(rank, name, text, label)
        self.times.append((time.monotonic(), text))


def test_state_is_warm_between_cells_and_value_is_rank0s(group):
    sink = CollectSink()
    group.run("counter = 10", sink=sink)
    result = group.run("counter += rank + 1\ncounter", sink=sink)
    assert result.values[0][0]["text/plain"] == "11" and result.values[1][0]["text/plain"] == "12"
    assert sink.values == [(0, {"text/plain": "11"})]
    assert group.pull("counter", rank=None) == [11, 12]


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_output_streams_while_the_cell_runs(group):
    sink = TimedSink()
    started = time.monotonic()
    group.run("import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')", sink=sink)
    ended = time.monotonic()
    first = next(t for t, text in sink.times if "first" in text)
    assert first - started < ended - started - 1.0, "output was buffered to the end of the cell"
    assert sink.text() == "first\nsecond\n"


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_metrics_reach_the_driver_before_the_cell_ends(group):
    arrivals = []
    group.subscribe_metrics(lambda recs: arrivals.extend((time.time(), r) for r in recs))
    group.run("import time\ntrain.report({'step': 1, 'loss': torch.tensor(0.5)})\ntime.sleep(1.5)",
              sink=CollectSink())
    assert {r["rank"] for _, r in arrivals} == {0, 1}
    for arrived, rec in arrivals:
        assert rec["metrics"] == {"step": 1, "loss": 0.5}
        assert arrived - rec["time"] < 1.0, "report() was buffered to the end of the cell"
    assert group.latest_metrics[1] == {"step": 1, "loss": 0.5}
    assert [s.last_metrics for s in group.status()] == [{"step": 1, "loss": 0.5}] * 2


def test_output_all_labels_and_ranks_subset(group):
    sink = CollectSink()
    group.run("print('hello from', rank)", output="all", sink=sink)
    assert sorted(sink.streams) == [(0, "stdout", "hello from 0\n"), (1, "stdout", "hello from 1\n")]
    sink = CollectSink()
    result = group.run("only = rank\nrank", ranks=[1], sink=sink)
    assert list(result.values) == [1] and sink.values == [(1, {"text/plain": "1"})]
    with pytest.raises(GroupError, match=r"ranks \[5\] do not exist: the group has ranks 0..1"):
        group.run("1", ranks=[5])
    with pytest.raises(GroupError, match="output='loud' is unknown"):
        group.run("1", output="loud")


def test_execute_returns_one_result_per_rank(group):
    def where(offset):
        import os

        import raytrain_nb

        ctx = raytrain_nb.get_context()
        return ctx.get_world_rank() + offset, int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])

    assert group.execute(where, 100) == [(100, 0, 2), (101, 1, 2)]


def test_rank_variables_and_environment(group):
    ctx = group.execute(lambda: __import__("raytrain_nb").get_context())
    assert [(c.get_world_rank(), c.get_world_size(), c.get_local_rank(), c.get_local_world_size(),
             c.get_node_rank()) for c in ctx] == [(0, 2, 0, 2, 0), (1, 2, 1, 2, 0)]
    envs = group.execute(lambda: {k: __import__("os").environ[k] for k in (
        "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "NODE_RANK", "MASTER_ADDR", "MASTER_PORT")})
    assert [e["LOCAL_RANK"] for e in envs] == ["0", "1"] and envs[0]["MASTER_PORT"] == envs[1]["MASTER_PORT"]


def test_push_and_pull_values(group):
    group.push(lr=0.5, names=["a", "b"])
    assert group.run("lr * 2", sink=CollectSink()).value == "1.0"
    model = group.pull("model")
    import torch

    assert type(model) is torch.nn.Linear and next(model.parameters()).device.type == "cpu"


def test_push_of_unpicklable_value_names_it(group):
    with pytest.raises(GroupError, match=r"cannot push 'lock': a lock cannot be pickled"):
        group.push(lock=threading.Lock())


def test_pull_of_missing_name(group):
    with pytest.raises(GroupError, match=r"name 'not_there' is not defined on rank 0: run the cell that defines it"):
        group.pull("not_there")


def test_errors_from_ranks_are_merged_and_show_the_cell(group):
    with pytest.raises(WorkerError) as info:
        group.run("def f():\n    return undefined_name\nf()", sink=CollectSink())
    err = info.value
    assert str(err) == "[rank 0, 1] NameError: name 'undefined_name' is not defined"
    text = err.render()
    assert text.count("NameError") == 1 and "return undefined_name" in text
    assert "_internal" not in text and "site-packages/ray" not in text
    assert group.run("1 + 1", sink=CollectSink()).value == "2"


def test_syntax_error_is_reported_once_before_running(group):
    group.run("marker = 'before'", sink=CollectSink())
    with pytest.raises(WorkerError) as info:
        group.run("marker = 'after'\nx = (", sink=CollectSink())
    assert info.value.type_names == ["SyntaxError"] and info.value.render().count("SyntaxError") == 1
    assert group.pull("marker") == "before"


def test_display_matplotlib_and_ipython_syntax(group):
    sink = CollectSink()
    group.run("import matplotlib.pyplot as plt\nplt.plot([1, 2, 3])\ndisplay({'a': 1})\n"
              "%time z = sum(range(10))\n!echo from-shell", sink=sink)
    kinds = [sorted(data) for _, data in sink.displays]
    assert ["text/plain"] in kinds and any("image/png" in k for k in kinds)
    assert "Wall time" in sink.text() and "from-shell" in sink.text()
    assert group.pull("z") == 45


def test_fd_output_stays_in_its_cell(group):
    sink = CollectSink()
    group.run("import os, ctypes\nos.system('echo from-subprocess')\nos.write(2, b'raw-stderr\\n')\n"
              "ctypes.CDLL(None).printf(b'from-c\\n')", sink=sink)
    assert "from-subprocess\n" in sink.text("stdout") and "from-c\n" in sink.text("stdout")
    assert "raw-stderr\n" in sink.text("stderr")
    after = CollectSink()
    group.run("pass", sink=after)
    assert after.streams == []


def test_status_has_one_row_per_rank(group):
    rows = group.status()
    assert [r.rank for r in rows] == [0, 1] and {r.state for r in rows} == {"idle"}
    assert len({r.pid for r in rows}) == 2 and all(r.device == "cpu" for r in rows)


def test_training_keeps_ranks_identical(group):
    group.run(STEP * 3, sink=CollectSink())
    assert_ranks_identical(rank_params(group), "parameters")


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_more_cpus_than_the_cluster_fails_at_once(ray_session):
    started = time.monotonic()
    with pytest.raises(ResourceError, match=r"2 workers x 1000 CPU = 2000 CPU asked, but the cluster has 8 CPU"):
        WorkerGroup(2, cpus_per_worker=1000)
    assert time.monotonic() - started < 10


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_resources_held_elsewhere_fail_within_the_timeout(group):
    started = time.monotonic()
    with pytest.raises(ResourceError, match=r"could not be placed within 2 s .*free now: .*CPU"):
        WorkerGroup(1, cpus_per_worker=7, placement_timeout_s=2)
    assert time.monotonic() - started < 10


def test_reload_picks_up_an_edited_module(ray_session, tmp_path, monkeypatch):
    (tmp_path / "helper_mod.py").write_text("VALUE = 1\n")
    monkeypatch.chdir(tmp_path)
    g = WorkerGroup(1, backend="none", activate=False)
    try:
        assert g.run("import helper_mod\nhelper_mod.VALUE", sink=CollectSink()).value == "1"
        (tmp_path / "helper_mod.py").write_text("VALUE = 2\n")
        g.reload("helper_mod")
        assert g.run("helper_mod.VALUE", sink=CollectSink()).value == "2"
    finally:
        g.shutdown()
    with pytest.raises(GroupError, match="this group was shut down"):
        g.run("1")


def test_shutdown_kills_ranks_without_taking_it_for_a_failure(ray_session, caplog):
    """A shutdown ends every rank's process (its process group with it) and no rank is reported dead on the way:
    the health monitor's check under way ends before the kills."""
    import psutil

    from ..waiting import wait_for

    g = WorkerGroup(2, activate=False, heartbeat_timeout_s=60)
    try:
        sink = CollectSink()
        g.run("import torch.distributed as dist\ndist.barrier()", sink=sink)  # the process group is up
        pids = [s.info["pid"] for s in g.slots]
        states = []
        g.subscribe(lambda old, new: states.append(new.value))
    finally:
        with caplog.at_level("WARNING", logger="raytrain_nb"):
            g.shutdown()
    assert states == ["shut down"], states
    assert not [r.getMessage() for r in caplog.records if "died" in r.getMessage()]

    def running(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    wait_for(lambda: not any(running(p) for p in pids), 30, f"the ranks' processes {pids} to end")
