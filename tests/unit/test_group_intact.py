"""Whether a cell's ranks may keep their process group after an interrupt (formation.group_intact)."""
from __future__ import annotations

from raytrain_nb._internal.group.formation import group_intact
from raytrain_nb._internal.worker.outcome import CellOutcome


def outcomes(*sequences, **flags):
    return [CellOutcome(rank=r, pg_sequence=seq, interrupted=True, **(flags if r == 1 else {}))
            for r, seq in enumerate(sequences)]


def test_every_rank_with_the_same_counts_keeps_the_group():
    assert group_intact(outcomes([7, 2], [7, 2], [7, 2]), 3, released=False)


def test_a_rank_that_issued_one_more_collective_re_forms():
    assert not group_intact(outcomes([8], [7]), 2, released=False)


def test_a_group_made_on_some_ranks_only_re_forms():
    assert not group_intact(outcomes([7, 1], [7]), 2, released=False)


def test_a_rank_without_counts_re_forms():  # no gloo group, or a torch without the counters
    assert not group_intact(outcomes([7], None), 2, released=False)
    assert not group_intact(outcomes([], []), 2, released=False)


def test_a_released_or_broken_rank_re_forms():
    assert not group_intact(outcomes([7], [7]), 2, released=True)
    assert not group_intact(outcomes([7], [7], pg_broken=True), 2, released=False)


def test_a_dead_or_replaced_rank_or_a_missing_answer_re_forms():
    assert not group_intact(outcomes([7], [7], dead=True), 2, released=False)
    assert not group_intact(outcomes([7], [7], replaced=True), 2, released=False)
    assert not group_intact(outcomes([7], [7]), 3, released=False)
    assert not group_intact([], 0, released=False)
