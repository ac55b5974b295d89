"""The two test lanes' lock (tests/lanes.py): shared turns together, an exclusive test alone, and a waiting
exclusive test let in before the other lane's next shared turn."""
from __future__ import annotations

import fcntl
import os
import threading

from ..lanes import Lanes
from ..waiting import wait_for


def _entered(lanes: Lanes, exclusive: bool) -> threading.Event:
    done = threading.Event()

    def enter() -> None:
        lanes.enter(exclusive)
        done.set()

    threading.Thread(target=enter, daemon=True).start()
    return done


def _gate_taken(folder) -> bool:
    fd = os.open(folder / "gate", os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_shared_turns_run_together(tmp_path):
    a, b = Lanes(tmp_path), Lanes(tmp_path)
    a.enter(False)
    assert _entered(b, False).wait(5), "a second shared turn waited for the first"


def test_an_exclusive_test_waits_for_the_shared_one_and_keeps_the_next_shared_one_out(tmp_path):
    a, b = Lanes(tmp_path), Lanes(tmp_path)
    a.enter(False)
    exclusive = _entered(b, True)
    wait_for(lambda: _gate_taken(tmp_path), 5, "the exclusive lane to wait at the gate")
    assert not exclusive.is_set(), "the exclusive test ran beside a shared one"

    a.leave()
    assert exclusive.wait(5), "the exclusive test was not let in when the shared one ended"
    shared = _entered(a, False)
    wait_for(lambda: _gate_taken(tmp_path), 5, "the shared lane to wait for the main lock")
    assert not shared.is_set(), "a shared turn ran beside the exclusive test"

    b.leave()
    assert shared.wait(5), "the shared lane was not let in again"


def test_a_waiting_exclusive_test_goes_before_the_other_lanes_next_turn(tmp_path):
    a, b = Lanes(tmp_path), Lanes(tmp_path)
    a.enter(False)
    exclusive = _entered(b, True)
    wait_for(lambda: _gate_taken(tmp_path), 5, "the exclusive lane to wait at the gate")
    a.leave()
    shared = _entered(a, False)  # at once: the gate keeps it behind the waiting exclusive test
    assert exclusive.wait(5), "the other lane's next shared turn went first"
    assert b.held == fcntl.LOCK_EX and not shared.is_set()
    b.leave()
    assert shared.wait(5)


def test_a_lane_moves_from_exclusive_to_shared_and_back(tmp_path):
    a, b = Lanes(tmp_path), Lanes(tmp_path)
    a.enter(True)
    a.enter(True)  # an exclusive stretch: held, not taken again
    assert a.held == fcntl.LOCK_EX
    a.enter(False)
    assert a.held == fcntl.LOCK_SH and _entered(b, False).wait(5)
