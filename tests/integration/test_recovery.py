"""Ranks that diverge, interrupts, stuck ranks: every rank returns and the group stays usable."""
from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from raytrain_nb import GroupError, WorkerError, WorkerGroup
from raytrain_nb._internal.output import CollectSink

from ..groups import SETUP, STEP, MarkerSink, assert_ranks_identical, rank_params, set_up_group

BLOCK_RANK0_IN_BACKWARD = """
loss = model(torch.randn(32, 10)).pow(2).mean()
if rank == 1:
    print('rank 1 busy', flush=True)
    {rank1}
loss.backward()
"""


def EventSink(marker):
    """Sets ``seen`` when ``marker`` appears in the output, or a notice comes."""
    return MarkerSink(marker, on_notice=True)


@pytest.fixture(scope="module")
def group(ray_session):
    with set_up_group(SETUP) as g:
        yield g


def assert_trains_identically(g):
    g.run(STEP, sink=CollectSink())
    ids = g.run("id(model) == model_id", output="all", sink=CollectSink()).values
    assert [v[0]["text/plain"] for v in ids.values()] == ["True", "True"]
    assert_ranks_identical(rank_params(g), "parameters")


def _fd_and_threads(g):
    return g.execute(lambda: (len(os.listdir("/proc/self/fd")), threading.active_count()))


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_divergent_error_releases_the_waiting_rank(group):
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:
        group.run(BLOCK_RANK0_IN_BACKWARD.format(rank1="raise ValueError('only rank 1 failed')"), sink=CollectSink())
    assert time.monotonic() - started < 10
    err = info.value
    assert err.ranks == [1] and str(err) == "[rank 1] ValueError: only rank 1 failed"
    assert "rank 0 released" in err.render()
    assert_trains_identically(group)


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_interrupt_releases_a_rank_blocked_in_ddp_backward(group):
    sink = EventSink("rank 1 busy")
    box = {}
    runner = threading.Thread(target=lambda: box.setdefault("exc", _expect_error(
        group, BLOCK_RANK0_IN_BACKWARD.format(rank1="while True:\n        pass"), sink)))
    runner.start()
    assert sink.seen.wait(60)
    started = time.monotonic()
    states = group.interrupt()
    runner.join(10)
    assert not runner.is_alive() and time.monotonic() - started < 2.0
    assert {s["state"] for s in states} <= {"stopped", "released"}
    assert set(box["exc"].type_names) == {"KeyboardInterrupt"}
    assert_trains_identically(group)


def _expect_error(g, source, sink):
    try:
        g.run(source, sink=sink, output="all")
    except (WorkerError, GroupError) as exc:  # GroupError: the re-forming after the interrupt failed
        return exc
    return None


def _sigint_when(event, delay=0.0):
    def fire():
        event.wait(60)
        time.sleep(delay)  # lets the cell get into its loop; the wait above is on the condition
        os.kill(os.getpid(), signal.SIGINT)

    t = threading.Thread(target=fire, daemon=True)
    t.start()
    return t


def test_ctrl_c_in_the_driver_interrupts_every_rank(group):
    sink = EventSink("looping")
    _sigint_when(sink.seen)
    with pytest.raises(WorkerError) as info:
        group.run("print('looping', flush=True)\nwhile True:\n" + "    " + STEP.strip().replace("\n", "\n    "),
                sink=sink)
    assert set(info.value.type_names) == {"KeyboardInterrupt"}
    assert_trains_identically(group)


def test_a_stuck_rank_is_named_then_replaced_by_a_second_interrupt(ray_session):
    g = WorkerGroup(2, backend="none")
    try:
        g.run("import time, raytrain_nb as train\nrank = train.get_context().get_world_rank()", sink=CollectSink())
        pid_before = g.status()[1].pid
        sink = EventSink("waiting")
        first = _sigint_when(sink.seen)
        done = threading.Event()

        def second():
            first.join()
            sink.seen.clear()
            sink.seen.wait(30)  # the notice naming the stuck rank
            os.kill(os.getpid(), signal.SIGINT)
            done.set()

        threading.Thread(target=second, daemon=True).start()
        with pytest.raises(WorkerError) as info:
            g.run("print('waiting', flush=True)\nif rank == 1:\n    time.sleep(600)", sink=sink)
        assert done.is_set()
        notice = "\n".join(sink.notices)
        assert "rank 1 did not stop after the interrupt" in notice and "time.sleep(600)" in notice
        assert "replaced by a fresh worker" in info.value.render()
        rows = g.status()
        assert rows[1].pid != pid_before and {r.state for r in rows} == {"idle"}
        assert g.run("import raytrain_nb as train\ntrain.get_context().get_world_rank()", ranks=[1],
                     sink=CollectSink()).value == "1"
    finally:
        g.shutdown()


def test_soak_interrupts_and_divergent_errors_leak_nothing(group):
    group.run(STEP, sink=CollectSink())
    before = _fd_and_threads(group)
    for cycle in range(50):
        if cycle % 2:
            with pytest.raises(WorkerError):
                group.run(BLOCK_RANK0_IN_BACKWARD.format(rank1="raise ValueError('x')"), sink=CollectSink())
        else:
            sink = EventSink("rank 1 busy")
            runner = threading.Thread(target=_expect_error, args=(
                group, BLOCK_RANK0_IN_BACKWARD.format(rank1="while True:\n        pass"), sink))
            runner.start()
            assert sink.seen.wait(60)
            group.interrupt()
            runner.join(30)
            assert not runner.is_alive()
        group.run(STEP, sink=CollectSink())
    after = _fd_and_threads(group)
    for (fd0, th0), (fd1, th1) in zip(before, after):
        assert fd1 <= fd0 + 2, f"file descriptors grew from {fd0} to {fd1}"
        # Ray starts an actor's threads for a concurrency group as its calls overlap, up to the group's size (the
        # control group's 4: interrupts, polls, activity); a leak of one a cycle would pass that in 50 cycles
        assert th1 <= th0 + 4, f"threads grew from {th0} to {th1}"
    assert_trains_identically(group)


GENERATION = "from raytrain_nb._internal.backend import process_group_state\nprocess_group_state().generation"


def _generations(g, sink=None):
    values = g.run(GENERATION, output="all", sink=sink or CollectSink()).values
    return [int(values[r][0]["text/plain"]) for r in sorted(values)]


def _interrupted(g, source, marker):
    """Run ``source`` until ``marker`` is printed, interrupt it, and return the ``WorkerError`` it ended with."""
    sink = EventSink(marker)
    box = {}
    runner = threading.Thread(target=lambda: box.setdefault("exc", _expect_error(g, source, sink)))
    runner.start()
    assert sink.seen.wait(60)
    g.interrupt()
    runner.join(30)
    assert not runner.is_alive()
    return box["exc"]


def test_an_interrupt_outside_any_collective_keeps_the_process_group_and_brings_ranks_in_line(group):
    before = _generations(group)
    exc = _interrupted(group, "import time\nwith torch.no_grad():\n    model.module.weight.add_(rank)\n"
                              "    opt.state.clear()\nprint('diverged', flush=True)\nwhile True:\n    time.sleep(0.01)",
                       "diverged")
    assert set(exc.type_names) == {"KeyboardInterrupt"}
    assert _generations(group) == before  # the same process group: not left and formed again
    assert_ranks_identical(rank_params(group), "parameters")  # rank 1's change undone from rank 0
    assert_trains_identically(group)


def test_an_interrupt_between_a_collective_and_its_peer_re_forms_the_group(group):
    """Rank 0 has begun an all-reduce rank 1 never joins: their counts differ, so keeping the group would pair
    rank 1's next collective with it; the group is formed again instead."""
    before = _generations(group)
    exc = _interrupted(group, "import time, torch.distributed as dist\n"
                              "if rank == 0:\n    pending = dist.all_reduce(torch.ones(4), async_op=True)\n"
                              "print('issued', flush=True)\nwhile True:\n    time.sleep(0.01)", "issued")
    assert set(exc.type_names) == {"KeyboardInterrupt"}
    assert [a > b for a, b in zip(_generations(group), before)] == [True, True]
    assert_trains_identically(group)


REFUSE_FORMING_ONCE = """
import torch.distributed as dist
if rank == 1:
    _real_init = dist.init_process_group
    def _refuse_once(*args, **kwargs):
        dist.init_process_group = _real_init
        raise RuntimeError('forming refused once (test)')
    dist.init_process_group = _refuse_once
"""


def test_a_failed_re_forming_is_reported_then_the_next_cell_forms_the_group_first(group):
    """The interrupt's re-forming fails on rank 1 (its first init_process_group raises): the interrupted cell
    ends in that GroupError; the next cell forms the group before it runs (a notice says so; a rank still in the
    failed forming is released first), and the ranks train in one group again."""
    group.run(REFUSE_FORMING_ONCE, sink=CollectSink())
    before = _generations(group)
    exc = _interrupted(group, "import time, torch.distributed as dist\n"
                              "if rank == 0:\n    pending = dist.all_reduce(torch.ones(4), async_op=True)\n"
                              "print('issued', flush=True)\nwhile True:\n    time.sleep(0.01)", "issued")
    assert "forming refused once (test)" in str(exc) and "re-form the process group" in str(exc)
    sink = CollectSink()
    after = _generations(group, sink)
    assert any("it forms before this cell" in n for n in sink.notices)
    assert [a > b for a, b in zip(after, before)] == [True, True]
    assert_trains_identically(group)

