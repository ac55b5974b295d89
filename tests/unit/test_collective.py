"""raytrain_nb.collective without Ray: rank 0's book (who arrived, who is told what), rank 0's waits with peers
played by fake workers, the driver's rounds and handles, and the deadline's setting."""
from __future__ import annotations

import ctypes
import pickle
import threading
import time
from types import SimpleNamespace

import pytest

from raytrain_nb._internal import settings
from raytrain_nb._internal.errors import (CollectiveError, CollectiveReleasedError, CollectiveTimeoutError,
                                          ConfigError, failure_from_exception)
from raytrain_nb._internal.group.collectives import CollectiveRounds, tell_finished
from raytrain_nb._internal.worker import cell, collective
from raytrain_nb._internal.worker.collective import CollectiveSpec, CollectiveWorker
from raytrain_nb._internal.worker.outcome import CellOutcome
from raytrain_nb._internal.worker.rendezvous import BARRIER, BROADCAST, Rendezvous
from raytrain_nb._internal.worker.session import TrainContext, WorkerSession, current_session, set_session

# -- rank 0's book -----------------------------------------------------------------------------------------------


def test_the_last_arrival_completes_and_the_others_are_told():
    book = Rendezvous()
    assert book.arrive((1, 1), 3, 0, BROADCAST, b"data") == (None, [])
    assert book.arrive((1, 1), 3, 2, BROADCAST, None, handle="h2") == (None, [])
    assert book.missing((1, 1), 3) == [1]
    outcome, notices = book.arrive((1, 1), 3, 1, BROADCAST, None, handle="h1")
    assert outcome == ("ok", b"data")  # rank 0's payload, whatever the others passed
    assert notices == [(0, (1, 1), outcome), (2, (1, 1), outcome)]
    assert book.missing((1, 1), 3) == [] and book.peer(2) == "h2"


def test_a_barrier_carries_no_payload_and_ranks_that_disagree_all_fail():
    book = Rendezvous()
    book.arrive((1, 1), 2, 0, BARRIER, None)
    assert book.arrive((1, 1), 2, 1, BARRIER, None, "h1")[0] == ("ok", None)
    book.arrive((1, 2), 2, 0, BARRIER, None)
    outcome, notices = book.arrive((1, 2), 2, 1, BROADCAST, None)
    assert outcome[0] == "error" and "rank 0 called barrier()" in outcome[1]
    assert "rank 1 called broadcast_from_rank_zero()" in outcome[1] and notices == [(0, (1, 2), outcome)]


def test_a_rank_that_stops_waiting_releases_the_others_and_later_arrivals():
    book = Rendezvous()
    book.arrive((4, 1), 3, 0, BARRIER, None)
    book.arrive((4, 1), 3, 1, BARRIER, None, "h1")
    notices = book.abandon((4, 1), 1, "interrupted")
    assert notices == [(0, (4, 1), ("released", "rank 1 stopped waiting (interrupted)"))]
    late = book.arrive((4, 1), 3, 2, BARRIER, None, "h2")  # rank 2 comes after rank 1 left: not kept waiting
    assert late == (("released", "rank 1 stopped waiting (interrupted)"), [])
    assert book.arrive((4, 2), 3, 0, BARRIER, None)[0][0] == "released"  # nor at the next one of the call


def test_a_rank_whose_call_ended_is_named_to_the_ranks_waiting_for_it():
    book = Rendezvous()
    book.arrive((2, 1), 3, 0, BARRIER, None)
    book.arrive((2, 1), 3, 1, BARRIER, None, "h1")
    notices = book.finished(2, {2: False})
    error = ("error", "rank 2 finished the call without arriving at it")
    assert notices == [(0, (2, 1), error), (1, (2, 1), error)]
    assert book.finished(2, {2: False}) == []  # told once
    book2 = Rendezvous()
    book2.arrive((2, 1), 2, 0, BARRIER, None)
    assert book2.finished(2, {1: True}) == [(0, (2, 1), ("released", "rank 1 failed"))]  # its error is the cell's


def test_a_new_round_forgets_what_an_earlier_one_left():
    book = Rendezvous()
    book.arrive((1, 1), 2, 0, BARRIER, None)  # an interrupted cell left rank 0 here
    book.finished(1, {1: True})
    assert book.arrive((2, 1), 2, 0, BARRIER, None) == (None, [])  # the next cell starts clean
    assert book.missing((2, 1), 2) == [1]
    outcome, _ = book.arrive((1, 1), 2, 1, BARRIER, None, "h1")  # a straggler of the ended cell
    assert outcome[0] == "released" and "already ended" in outcome[1]
    assert book.arrive((2, 1), 2, 1, BARRIER, None)[0] == ("ok", None)


def test_a_rank_that_never_introduced_itself_is_refused():
    book = Rendezvous()
    book.arrive((1, 1), 2, 0, BARRIER, None)
    outcome, notices = book.arrive((1, 1), 2, 1, BARRIER, None)
    assert outcome[0] == "error" and "rank 1's worker is unknown" in outcome[1]
    assert notices == [(0, (1, 1), outcome)]


# -- rank 0's waits, with fake peers ---------------------------------------------------------------------------


class FakePeer:
    """A peer's worker: records what rank 0 tells it."""

    def __init__(self):
        self.told = []
        self.collective_release = SimpleNamespace(remote=lambda key, outcome: self.told.append((key, outcome)))


@pytest.fixture
def rank0(monkeypatch):
    """This process as rank 0 of a call of round 7 (world size 3, a 2 s deadline), with a fresh book."""
    monkeypatch.setattr(collective, "RENDEZVOUS", Rendezvous())
    monkeypatch.setattr(collective, "_STATE", collective._RankState())
    before = current_session()
    set_session(WorkerSession(TrainContext(0, 3, 0, 3, 0)))
    collective.begin(CollectiveSpec(7, 3, 2.0, 1), partial=False)
    yield CollectiveWorker()
    set_session(before)


def _in_thread(fn, *args):
    box = {}

    def run():
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            box["error"] = exc
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, box


def _until(what, check, timeout=5.0):
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"waited {timeout} s for {what}"
        time.sleep(0.01)


def test_rank0_broadcasts_to_peers_that_arrive(rank0):
    peers = {1: FakePeer(), 2: FakePeer()}
    thread, box = _in_thread(collective.broadcast_from_rank_zero, {"split": [1, 2]})
    _until("rank 0 to wait", lambda: collective.waiting_at() == (7, 1))
    assert rank0.collective_arrive((7, 1), 3, 2, BROADCAST, peers[2]) is None
    outcome = rank0.collective_arrive((7, 1), 3, 1, BROADCAST, peers[1])  # the last one learns it from its call
    thread.join(5)
    assert box == {"value": {"split": [1, 2]}} and collective.waiting_at() is None
    assert outcome[0] == "ok" and pickle.loads(outcome[1]) == {"split": [1, 2]}
    assert peers[2].told == [((7, 1), outcome)] and peers[1].told == []


def test_rank0_times_out_naming_the_rank_that_did_not_arrive(rank0):
    collective.begin(CollectiveSpec(8, 3, 0.3, 1), partial=False)
    peer = FakePeer()
    thread, box = _in_thread(collective.barrier)
    _until("rank 0 to wait", lambda: collective.waiting_at() == (8, 1))
    rank0.collective_arrive((8, 1), 3, 1, BARRIER, peer)
    thread.join(5)
    error = box["error"]
    assert isinstance(error, CollectiveTimeoutError) and error.missing == [2] and "\n" not in str(error)
    assert str(error).startswith("barrier(): rank 2 did not arrive within 0.3 s")
    assert settings.COLLECTIVE_TIMEOUT_S.name in str(error)
    assert peer.told == [((8, 1), ("released", "rank 0 stopped waiting (its deadline passed)"))]
    assert pickle.loads(pickle.dumps(error)).missing == [2]


def test_a_rank_whose_call_ended_fails_rank0_at_once(rank0):
    peer = FakePeer()
    thread, box = _in_thread(collective.barrier)
    _until("rank 0 to wait", lambda: collective.waiting_at() == (7, 1))
    rank0.collective_arrive((7, 1), 3, 1, BARRIER, peer)
    started = time.monotonic()
    rank0.collective_finished(7, {2: False})
    thread.join(5)
    assert time.monotonic() - started < 1.0
    assert isinstance(box["error"], CollectiveError)
    assert str(box["error"]) == "barrier(): rank 2 finished the call without arriving at it"
    assert peer.told == [((7, 1), ("error", "rank 2 finished the call without arriving at it"))]


def test_the_drivers_release_ends_the_wait_as_collateral(rank0):
    thread, box = _in_thread(collective.barrier)
    _until("rank 0 to wait", lambda: collective.waiting_at() == (7, 1))
    assert collective.release_waiting()
    thread.join(5)
    error = box["error"]
    assert isinstance(error, CollectiveReleasedError)
    assert failure_from_exception(0, error, "").collateral  # shown only when no rank has an error of its own
    with pytest.raises(CollectiveReleasedError):  # the call's later collectives fail at once
        collective.barrier()


def test_ctrl_c_ends_the_wait_and_releases_the_peers(rank0):
    peer = FakePeer()
    thread, box = _in_thread(collective.barrier)
    _until("rank 0 to wait", lambda: collective.waiting_at() == (7, 1))
    rank0.collective_arrive((7, 1), 3, 1, BARRIER, peer)
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(KeyboardInterrupt))
    thread.join(5)
    assert not thread.is_alive() and isinstance(box["error"], KeyboardInterrupt)
    assert peer.told == [((7, 1), ("released", "rank 0 stopped waiting (interrupted)"))]


def test_a_rank_alone_a_partial_call_and_no_worker(rank0):
    collective.begin(None, partial=False)  # a new rank replaying cells alone
    assert collective.broadcast_from_rank_zero(5) == 5 and collective.barrier() is None
    collective.begin(CollectiveSpec(9, 1, 2.0, 1), partial=False)  # a one-rank group
    assert collective.broadcast_from_rank_zero("x") == "x"
    collective.begin(CollectiveSpec(9, 3, 2.0, 1), partial=True)
    with pytest.raises(CollectiveError, match=r"barrier\(\) needs every rank .*--ranks"):
        collective.barrier()
    set_session(None)
    with pytest.raises(RuntimeError, match="works only on a worker"):
        collective.barrier()


def test_a_collective_error_shows_the_users_call_not_our_stack(rank0):
    collective.begin(CollectiveSpec(9, 3, 2.0, 1), partial=True)
    body, tail = cell.compile_cell("from raytrain_nb import collective\ncollective.barrier()\n", "<cell-3>")
    with pytest.raises(CollectiveError) as info:
        cell.run_compiled(body, tail, {})
    text = cell.format_user_traceback(info.value)
    assert text.splitlines()[-3:] == ['  File "<cell-3>", line 2, in <module>', "    collective.barrier()",
                                      f"CollectiveError: {info.value}"], text


# -- the driver's side -----------------------------------------------------------------------------------------


def test_rounds_grow_and_rank0s_handle_goes_only_where_it_is_new(monkeypatch):
    monkeypatch.delenv(settings.COLLECTIVE_TIMEOUT_S.name, raising=False)
    rounds = CollectiveRounds()
    first = rounds.specs(["a0", "a1", "a2"], [0, 1, 2])
    assert [s.round for s in first] == [1, 1, 1] and {s.world_size for s in first} == {3}
    assert [s.coordinator for s in first] == [None, "a0", "a0"] and first[0].timeout_s == 1800
    again = rounds.specs(["a0", "a1", "a2"], [0, 1, 2])
    assert [s.round for s in again] == [2, 2, 2] and [s.coordinator for s in again] == [None, None, None]
    replaced = rounds.specs(["a0", "b1", "a2"], [0, 1, 2])  # rank 1 has a fresh worker
    assert [s.coordinator for s in replaced] == [None, "a0", None] and replaced[1].token == first[1].token
    new_rank0 = rounds.specs(["b0", "b1"], [0, 1])  # a rescale, rank 0 replaced
    assert [s.coordinator for s in new_rank0] == [None, "b0"] and new_rank0[1].token == first[1].token + 1
    monkeypatch.setenv(settings.COLLECTIVE_TIMEOUT_S.name, "2.5")
    assert rounds.specs(["b0", "b1"], [1])[0].timeout_s == 2.5


@pytest.mark.parametrize("raw", ["soon", "0", "-3", "inf"])
def test_a_bad_deadline_is_one_line_naming_the_value(monkeypatch, raw):
    monkeypatch.setenv(settings.COLLECTIVE_TIMEOUT_S.name, raw)
    with pytest.raises(ConfigError) as info:
        CollectiveRounds().specs(["a0"], [0])
    assert repr(raw) in str(info.value) and "\n" not in str(info.value)


def test_the_driver_tells_rank0_once_which_ranks_ended():
    sent = []
    rank0 = SimpleNamespace(collective_finished=SimpleNamespace(remote=lambda *a: sent.append(a)))
    told = set()
    ok, failed = CellOutcome(rank=2), CellOutcome(rank=3)
    failed.failure = failure_from_exception(3, ValueError("bad"), "")
    tell_finished(rank0, {2: ok}, {}, told)  # nobody waits: nothing to tell
    assert sent == []
    tell_finished(rank0, {2: ok, 3: failed}, {0: (5, 1), 1: None}, told)
    tell_finished(rank0, {2: ok, 3: failed}, {0: (5, 1)}, told)
    assert sent == [(5, {2: False, 3: True})]
