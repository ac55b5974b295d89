"""The driver's wait for a collective step checks that every rank it waits for is in that step.

Real Ray actors stand in for workers: each answers ``activity`` and ``release`` on a second thread while
its step call blocks, as a worker's control channel does. A rank idle, or finished, while its peers wait
is a protocol error named in seconds (not after the step's deadline), and the waiting ranks are released.
"""
from __future__ import annotations

import threading
import time

import pytest
import ray

from raytrain_nb import GroupError, RecoveryError
from raytrain_nb._internal.group.slots import Slot
from raytrain_nb._internal.group.steps import await_step
from raytrain_nb._internal.group.timing import STEP_GRACE_S


@ray.remote(max_concurrency=4, num_cpus=0)
class FakeRank:
    def __init__(self):
        self.current = None
        self.released = threading.Event()

    def _join(self, block):
        self.current = "_join"
        try:
            if block:
                if not self.released.wait(120):
                    return "never released"
                raise RuntimeError("the process group was broken")
            return "joined"
        finally:
            self.current = None

    def _preload_then_join(self, checks):
        """A worker still importing torch when the step is sent (a busy machine): its step waits behind the
        preload, which ends after the driver asked ``checks`` times what it does."""
        self.current, self.checks = "_preload", checks
        self.gate = threading.Event()
        try:
            if not self.gate.wait(120):
                return "preload never ended"
            self.current = "_join"
            self.preloaded = True
            return "joined"
        finally:
            self.current = None

    def _join_with(self, peer):
        """In the step until ``peer`` is in it too (a collective)."""
        self.current = "_join"
        try:
            for _ in range(2400):
                if ray.get(peer.past_preload.remote(), timeout=10):
                    return "joined"
                self.released.wait(0.05)
            return "peer never came"
        finally:
            self.current = None

    def _join_fail(self, message, delay):
        """Fails the step after ``delay`` seconds with ``message`` (a peer's lost connection, or the cause)."""
        self.current = "_join"
        try:
            self.released.wait(delay)
            raise RuntimeError(message)
        finally:
            self.current = None

    def past_preload(self):
        return getattr(self, "preloaded", False)

    def activity(self):
        if self.current == "_preload":
            self.checks -= 1
            if self.checks <= 0:
                self.gate.set()
        return {"call": self.current, "phase": "", "preparing": self.current == "_preload"}

    def release(self):
        self.released.set()
        return True

    def was_released(self):
        return self.released.is_set()


def slots_of(actors):
    return [Slot(actor=a, pg=None, bundle=0, info={}) for a in actors]


def timed(fn):
    start = time.monotonic()
    try:
        fn()
    finally:
        timed.took = time.monotonic() - start


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_a_rank_idle_while_its_peer_waits_is_named_in_seconds_and_the_peer_released(ray_session):
    ranks = [FakeRank.remote(), FakeRank.remote()]
    refs = [ranks[0]._join.remote(True)]  # rank 1 never got the step
    refs.append(ray.put("never ran"))
    with pytest.raises(RecoveryError) as info:
        timed(lambda: await_step(slots_of(ranks), refs, "_join", deadline_s=120, silent_s=30))
    assert "rank(s) 1 finished while rank(s) 0 still wait in it" in str(info.value)
    assert timed.took < 4 * STEP_GRACE_S
    assert ray.get(ranks[0].was_released.remote(), timeout=10)


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_a_rank_doing_something_else_is_named(ray_session):
    ranks = [FakeRank.remote(), FakeRank.remote()]
    refs = [ranks[0]._join.remote(True), ranks[1]._join.remote(True)]
    other = FakeRank.remote()  # rank 1's answers come from an actor that is idle: "not in the step"
    slots = slots_of([ranks[0], other])
    with pytest.raises(RecoveryError, match=r"rank 1 is idle, not in the step, while its peers wait"):
        timed(lambda: await_step(slots, refs, "_join", deadline_s=120, silent_s=30))
    assert timed.took < 4 * STEP_GRACE_S
    ray.get(ranks[1].release.remote(), timeout=10)


def test_every_rank_in_the_step_waits_until_the_deadline_then_fails_naming_them(ray_session):
    ranks = [FakeRank.remote(), FakeRank.remote()]
    refs = [r._join.remote(True) for r in ranks]
    with pytest.raises(GroupError, match=r"did not re-form the process group within 3 s \(rank\(s\) 0, 1"):
        await_step(slots_of(ranks), refs, "_join", deadline_s=3, silent_s=30)


def test_a_step_every_rank_finishes_returns_their_answers(ray_session):
    ranks = [FakeRank.remote(), FakeRank.remote()]
    refs = [r._join.remote(False) for r in ranks]
    assert await_step(slots_of(ranks), refs, "_join", deadline_s=30, silent_s=30) == ["joined", "joined"]


def test_a_rank_still_starting_is_waited_for_not_called_a_protocol_error(ray_session):
    """On a loaded machine a rank may still be importing torch when the group's first rendezvous begins: its
    step is on its way. It used to be named "running _preload, not in the step (a protocol error)" after
    ``STEP_GRACE_S``; its preload here lasts well past that (ten checks of what it does)."""
    ranks = [FakeRank.remote(), FakeRank.remote()]
    refs = [ranks[0]._join_with.remote(ranks[1]), ranks[1]._preload_then_join.remote(10)]
    assert await_step(slots_of(ranks), refs, "_join", deadline_s=120, silent_s=30) == ["joined", "joined"]


def test_a_rank_still_starting_at_the_deadline_is_named_as_starting(ray_session):
    ranks = [FakeRank.remote(), FakeRank.remote()]
    refs = [ranks[0]._join.remote(True), ranks[1]._preload_then_join.remote(10_000)]
    with pytest.raises(GroupError, match=r"within 8 s: rank\(s\) 1 still starting \(importing torch"):
        await_step(slots_of(ranks), refs, "_join", deadline_s=STEP_GRACE_S + 3, silent_s=30)
    ray.get(ranks[1].release.remote(), timeout=10)


def test_a_failed_step_names_the_rank_that_caused_it_not_a_peer_that_lost_it(ray_session):
    """A rank whose peer left the step meets "Connection refused" or "closed by peer", often before the peer's own
    error comes back: the error named is the peer's, with the others counted."""
    cause, lost = FakeRank.remote(), FakeRank.remote()
    refs = [cause._join_fail.remote("the state could not be brought in line", 1.0),
            lost._join_fail.remote("[pair.cc:553] Connection closed by peer [127.0.0.1]:16768", 0.0)]
    with pytest.raises(GroupError) as info:
        await_step(slots_of([cause, lost]), refs, "_join", 60, 60)
    text = str(info.value)
    assert "could not re-form the process group: rank 0: RuntimeError: the state could not be brought in line" in text
    assert "rank(s) 1 failed too, after it" in text and "closed by peer" not in text
