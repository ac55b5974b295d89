"""raytrain_nb.collective in real groups: barrier and broadcast on gloo and on no process group, a rank that never
arrives named within the deadline, failures, Ctrl-C and a restart that leave no stale barrier, and a trainer."""
from __future__ import annotations

import threading
import time

import pytest

from raytrain_nb import DataParallelTrainer, RunConfig, ScalingConfig, WorkerError, WorkerGroup
from raytrain_nb._internal import settings
from raytrain_nb._internal.output import CollectSink

from ..groups import STEP, MarkerSink, quiet

#: Rank 0 prepares a file while the others wait at the barrier, then broadcasts what it made.
PREPARE = """
import os, time, tempfile, raytrain_nb as train
from raytrain_nb import collective
rank = train.get_context().get_world_rank()
path = os.path.join(tempfile.gettempdir(), f"raytrain_nb_collective_{os.getppid()}_{tag}")
if rank == 0:
    time.sleep(0.3)                      # slow preparation: without the barrier rank 1 reads too early
    with open(path, "w") as f:
        f.write("prepared")
collective.barrier()
with open(path) as f:
    seen = f.read()
info = collective.broadcast_from_rank_zero({"path": path, "by": rank} if rank == 0 else None)
started = time.perf_counter()
for _ in range(20):
    collective.barrier()
per_barrier_ms = (time.perf_counter() - started) / 20 * 1000
(seen, info, per_barrier_ms)
"""


@pytest.fixture(scope="module")
def none_group(ray_session):
    """Two ranks with no process group (the XGBoost / LightGBM / ``none`` kind)."""
    g = WorkerGroup(2, backend="none")
    try:
        quiet(g, "import os, time, raytrain_nb as train\nfrom raytrain_nb import collective\n"
                 "rank = train.get_context().get_world_rank()")
        yield g
    finally:
        g.shutdown()


def _values(g, source):
    result = quiet(g, source, output="all")
    return {rank: eval(value[0]["text/plain"]) for rank, value in result.values.items()}  # noqa: S307 - our repr


@pytest.mark.parametrize("kind", ["gloo", "none"])
def test_rank0_prepares_while_the_others_wait_then_broadcasts(kind, group, none_group):
    g = group if kind == "gloo" else none_group
    values = _values(g, PREPARE.replace("{tag}", kind))
    path = values[0][1]["path"]
    for rank in (0, 1):
        seen, info, per_barrier_ms = values[rank]
        assert seen == "prepared" and info == {"path": path, "by": 0}
        assert per_barrier_ms < 500, f"rank {rank}: {per_barrier_ms:.0f} ms a barrier"


#: Rank 0 waits at a barrier; rank 1 stays busy until well past rank 0's deadline (1.5 s), never arriving.
NEVER_ARRIVES = """
if rank == 0:
    open({flag!r}, "w").close()
    collective.barrier()
else:
    waited = time.monotonic() + 30
    while not os.path.exists({flag!r}) and time.monotonic() < waited:
        time.sleep(0.02)
    time.sleep(2.5)
"""


def test_a_rank_that_never_arrives_is_named_within_the_deadline(none_group, monkeypatch, tmp_path):
    monkeypatch.setenv(settings.COLLECTIVE_TIMEOUT_S.name, "1.5")
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        quiet(none_group, NEVER_ARRIVES.format(flag=str(tmp_path / "rank0_arrived")))
    assert time.monotonic() - started < 15
    assert info.value.ranks == [0] and info.value.type_names == ["CollectiveTimeoutError"]
    assert str(info.value) == ("[rank 0] CollectiveTimeoutError: barrier(): rank 1 did not arrive within 1.5 s "
                               f"({settings.COLLECTIVE_TIMEOUT_S.name} sets this deadline)")


def test_a_rank_that_returns_without_arriving_is_named_at_once(none_group):
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        quiet(none_group, "if rank == 0:\n    collective.broadcast_from_rank_zero(1)")
    assert time.monotonic() - started < 10  # not the 1800 s deadline: the driver saw rank 1 end
    assert str(info.value) == ("[rank 0] CollectiveError: broadcast_from_rank_zero(): rank 1 finished the call "
                               "without arriving at it")


def test_a_rank_that_fails_releases_the_one_waiting(none_group):
    with pytest.raises(WorkerError) as info:
        quiet(none_group, "if rank == 1:\n    raise ValueError('no data here')\ncollective.barrier()")
    assert str(info.value) == "[rank 1] ValueError: no data here"  # rank 0's release is collateral
    assert {f.rank: f.type_name for f in info.value.failures} == {0: "CollectiveReleasedError", 1: "ValueError"}


def test_ranks_that_disagree_fail_and_partial_cells_are_refused(none_group):
    with pytest.raises(WorkerError) as info:
        quiet(none_group, "collective.barrier() if rank == 0 else collective.broadcast_from_rank_zero(0)")
    assert "rank 0 called barrier(); rank 1 called broadcast_from_rank_zero()" in str(info.value)
    with pytest.raises(WorkerError, match=r"needs every rank of the group.*--ranks"):
        quiet(none_group, "collective.barrier()", ranks=[1])


def test_a_rank_killed_at_a_barrier_then_a_restart_leaves_no_stale_barrier(none_group):
    with pytest.raises(WorkerError) as info:
        quiet(none_group, "if rank == 1:\n    os.kill(os.getpid(), 9)\ncollective.barrier()")
    assert [d.rank for d in info.value.deaths] == [1]
    none_group.restart()
    assert _values(none_group, "collective.barrier()\ncollective.broadcast_from_rank_zero(('after', rank))") == {
        0: ("after", 0), 1: ("after", 0)}


def test_ctrl_c_releases_a_rank_waiting_at_the_barrier(group):
    sink = MarkerSink("at the barrier")
    cell = ("import time\nfrom raytrain_nb import collective\nif rank == 0:\n    print('at the barrier', flush=True)\n"
            "    collective.barrier()\nelse:\n    while True:\n        time.sleep(0.01)")
    background = group.run(cell, sink=sink, background=True)
    assert sink.seen.wait(60), "rank 0 never reached the barrier"
    started = time.monotonic()
    states = group.interrupt()
    with pytest.raises(WorkerError) as info:
        background.wait(30)
    assert time.monotonic() - started < 5
    assert {s["state"] for s in states} <= {"stopped", "released"}
    assert set(info.value.type_names) == {"KeyboardInterrupt"}
    quiet(group, STEP)  # the process group re-formed: DDP trains
    assert _values(group, "collective.broadcast_from_rank_zero(rank)") == {0: 0, 1: 0}


def _train(config):
    from raytrain_nb import collective, get_context, report

    rank = get_context().get_world_rank()
    shard = collective.broadcast_from_rank_zero({"rows": config["rows"]} if rank == 0 else None)
    collective.barrier()
    assert shard == {"rows": 8}, shard
    report({"rows": shard["rows"], "rank": rank})


def test_a_trainer_uses_barrier_and_broadcast(ray_session, tmp_path):
    result = DataParallelTrainer(_train, train_loop_config={"rows": 8},
                                 scaling_config=ScalingConfig(num_workers=2),
                                 run_config=RunConfig(storage_path=str(tmp_path), name="collective")).fit()
    assert result.error is None and result.metrics["rows"] == 8
