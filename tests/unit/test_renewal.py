"""A renewal with fresh processes for every rank (TensorFlow groups) that failed: no rank is left half-made, and the
state handed over stays for the next restart (group/undo.py)."""
from __future__ import annotations

import logging
from types import SimpleNamespace

from raytrain_nb._internal.group import undo
from raytrain_nb._internal.group.state import GroupState, SlotState


class _Slot:
    def __init__(self):
        self.actor, self.state, self.why = object(), SlotState.IDLE, ""

    def mark(self, state, why=""):
        self.state, self.why = state, why


class _Group(SimpleNamespace):
    def transition(self, state):
        self.state = state


def test_a_failed_renewal_ends_every_new_rank_and_keeps_the_handed_over_state(caplog):
    group = _Group(slots=[_Slot(), _Slot()], carried=(1, b"state"), state=GroupState.RECOVERING)
    with caplog.at_level(logging.WARNING, logger=undo.logger.name):
        undo.renewal_failed(group)
    assert [s.state for s in group.slots] == [SlotState.DEAD, SlotState.DEAD]
    assert group.state is GroupState.FAILED and group.carried == (1, b"state")
    assert "the state of rank 1 is kept: %dist_restart (group.restart()) again" in caplog.text


def test_with_nothing_handed_over_no_restart_from_it_is_promised(caplog):
    group = _Group(slots=[_Slot()], carried=None, state=GroupState.RECOVERING)
    with caplog.at_level(logging.WARNING, logger=undo.logger.name):
        undo.renewal_failed(group)
    assert group.state is GroupState.FAILED and "is kept" not in caplog.text
