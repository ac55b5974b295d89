"""Before a new formation the driver waits for ranks still in an earlier one (group/steps.py ``await_settled``)."""
from __future__ import annotations

import pytest

from raytrain_nb._internal.errors import GroupError
from raytrain_nb._internal.group import steps


class Ranks:
    """What each check of the ranks says they do (one dict per check); the releases asked, in order."""

    def __init__(self, checks):
        self.checks = list(checks)
        self.released = []

    def activities(self, slots, ranks):
        now = self.checks.pop(0) if len(self.checks) > 1 else self.checks[0]
        return {r: {"call": now.get(r)} for r in ranks}

    def release(self, slots):
        self.released.append(sorted(slots))


@pytest.fixture
def ranks(monkeypatch):
    def make(checks):
        fake = Ranks(checks)
        monkeypatch.setattr(steps, "_activities", fake.activities)
        monkeypatch.setattr(steps, "release_ranks", fake.release)
        monkeypatch.setattr(steps, "STEP_CHECK_S", 0.0)
        return fake
    return make


def test_settled_ranks_are_left_alone(ranks):
    fake = ranks([{0: None, 1: "_run_cell"}])
    steps.await_settled([0, 1], 10)
    assert fake.released == []


def test_a_rank_that_reached_the_old_rendezvous_after_a_release_is_released_too(ranks):
    # rank 1 is in the old join; once released, rank 2 (which was still leaving its old group) reaches it
    fake = ranks([{1: "_join"}, {2: "_join"}, {}])
    steps.await_settled([0, 1, 2], 10)
    assert fake.released == [[1], [2]]


def test_a_rank_that_never_leaves_is_named_at_the_deadline(ranks):
    fake = ranks([{0: "_setup", 3: "_join"}])
    with pytest.raises(GroupError, match=r"rank\(s\) 0, 3 are still in an earlier formation .* after 0 s"):
        steps.await_settled([0, 1, 2, 3], 0)
    assert fake.released == [[0, 3]]
