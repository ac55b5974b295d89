"""The fan-out asks every rank at once under one deadline and types each answer: ok, raised, died, unresponsive,
late. Real Ray actors stand in for workers."""
from __future__ import annotations

import threading

import pytest
import ray

from raytrain_nb import GroupError
from raytrain_nb._internal.errors import WorkerDiedError, WorkerLostError, WorkerUnresponsiveError
from raytrain_nb._internal.group.fanout import FANOUT, ReplyKind, collect
from raytrain_nb._internal.group.slots import Slot
from raytrain_nb._internal.group.state import SlotState

from ..waiting import wait_for


@ray.remote(max_concurrency=2, num_cpus=0)
class Rank:
    def __init__(self, behaviour):
        self.behaviour = behaviour
        self.gate = threading.Event()

    def ask(self, x):
        if self.behaviour == "raise":
            raise NameError(f"name 'x{x}' is not defined")
        if self.behaviour == "hang":
            self.gate.wait(60)
        return x * 2

    def open(self):
        self.gate.set()

    def ping(self):
        return True


def _dead(actor) -> bool:
    """Whether a call to ``actor`` now fails as a dead actor's (a call that still answers means not yet)."""
    try:
        ray.get(actor.ping.remote(), timeout=30)
    except ray.exceptions.RayActorError:
        return True
    return False


def _slots(behaviours):
    """One started actor per behaviour (each has answered once: none is late for being slow to start)."""
    actors = [Rank.remote(b) for b in behaviours]
    ray.get([a.ping.remote() for a in actors], timeout=120)
    return [Slot(actor=a, pg=None, bundle=0, info={"pid": 1000 + i, "node_ip": "127.0.0.1"})
            for i, a in enumerate(actors)]


def test_every_kind_of_answer_is_typed(ray_session):
    slots = _slots(["ok", "raise", "hang", "ok", "ok"])
    ray.kill(slots[3].actor, no_restart=True)
    wait_for(lambda: _dead(slots[3].actor), 60, "the kill of rank 3 to land (ray.kill is asynchronous)")
    slots[4].mark(SlotState.UNRESPONSIVE, "has not answered for 20 s")
    try:
        replies = FANOUT.ask(slots, lambda s: s.actor.ask.remote(21), 3.0, "every rank to answer")
        assert [r.kind for r in replies] == [ReplyKind.OK, ReplyKind.RAISED, ReplyKind.LATE, ReplyKind.DIED,
                                             ReplyKind.UNRESPONSIVE]
        assert replies.values() == {0: 42}
        assert isinstance(replies[1].error, NameError)  # the remote exception itself, not Ray's wrapper
        died = replies[3].error
        assert isinstance(died, WorkerDiedError) and isinstance(died, GroupError)
        assert (died.rank, died.pid, died.node) == (3, 1003, "127.0.0.1")
        assert isinstance(replies[4].error, WorkerUnresponsiveError) and isinstance(replies[4].error, WorkerLostError)
        with pytest.raises(WorkerDiedError, match=r"rank 3 \(pid 1003, node 127.0.0.1\) died"):
            replies.check()
    finally:
        ray.get(slots[2].actor.open.remote(), timeout=10)


def test_check_names_who_raised_or_did_not_answer(ray_session):
    slots = _slots(["ok", "raise"])
    replies = FANOUT.ask(slots, lambda s: s.actor.ask.remote(1), 10.0, "every rank to answer", ranks=[4, 7])
    assert replies.ranks(ReplyKind.RAISED) == [7]
    with pytest.raises(GroupError, match=r"rank 7 raised NameError: name 'x1' is not defined \(while waiting for "
                                         r"every rank to answer\)"):
        replies.check()
    slots = _slots(["ok", "hang"])
    try:
        with pytest.raises(GroupError, match=r"after 2 s \(no answer from rank\(s\) 1\): raise it"):
            collect([s.actor.ask.remote(1) for s in slots], 2.0, "every rank to answer", slots, hint="raise it")
    finally:
        ray.get(slots[1].actor.open.remote(), timeout=10)
    assert collect([s.actor.ask.remote(3) for s in _slots(["ok", "ok"])], 10.0, "every rank to answer") == [6, 6]


@ray.remote(num_cpus=0)
class Fetcher:
    def fetch(self, refs):
        return ray.get(refs[0], timeout=60)

    def ping(self):
        return True


def test_a_call_that_meets_another_workers_death_raised_and_its_own_worker_lives(ray_session):
    dead, fetcher = _slots(["ok"])[0], Fetcher.remote()
    ray.kill(dead.actor, no_restart=True)
    wait_for(lambda: _dead(dead.actor), 60, "the kill to land")
    slot = Slot(actor=fetcher, pg=None, bundle=0, info={"pid": 7, "node_ip": "127.0.0.1"})
    replies = FANOUT.ask([slot], lambda s: s.actor.fetch.remote([dead.actor.ask.remote(1)]), 30.0, "the fetch")
    assert replies[0].kind is ReplyKind.RAISED and isinstance(replies[0].error, ray.exceptions.RayActorError)
    assert ray.get(fetcher.ping.remote(), timeout=30)


def test_a_collective_collect_releases_the_ranks_still_waiting_once_one_died(ray_session):
    slots = _slots(["hang", "ok", "hang"])
    released = []

    def release(pending):
        released.append(pending)
        for i in pending:  # what releasing does to a rank blocked in a collective: its call returns at once
            ray.get(slots[i].actor.open.remote(), timeout=10)

    ray.kill(slots[1].actor, no_restart=True)
    wait_for(lambda: _dead(slots[1].actor), 60, "the kill of rank 1 to land")
    with pytest.raises(WorkerDiedError, match=r"rank 1 \(pid 1001"):
        collect([s.actor.ask.remote(2) for s in slots], 300.0, "every rank to answer", slots, on_death=release)
    assert released == [[0, 2]]
