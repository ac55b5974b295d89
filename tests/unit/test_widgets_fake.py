"""Dashboard widget rules on a stand-in group: results and errors in the status line, refusals."""
from __future__ import annotations

import threading

import pytest

from raytrain_nb import GroupState
from raytrain_nb._internal.errors import GroupError
from raytrain_nb.notebook.dashboard.actions import act
from raytrain_nb.notebook.dashboard.view import Dashboard

from .fake_group import FakeGroup


@pytest.fixture
def dash():
    d = Dashboard(FakeGroup())
    yield d
    d.close()


def test_rows_badges_and_tooltips_follow_the_group(dash):
    g = dash.group
    assert sorted(dash.rows) == [0, 1]
    assert "idle" in dash.rows[0].state.value and dash.rows[0].pid.value == "100"
    assert dash.buttons["restart"].disabled and dash.buttons["restart"].tooltip == "no dead worker: every rank is alive"
    g.workers[1].error = "the process was killed (SIGKILL)"
    g.set_state(GroupState.FAILED, r1="dead")
    dash.flush()  # the timer thread does this within 100 ms
    row = dash.rows[1]
    assert "rtnb-state-dead" in row.box._dom_classes and "SIGKILL" in row.metrics.value
    assert row.box.layout.border_left.startswith("4px solid #c62828")
    assert not dash.buttons["restart"].disabled
    g.report(1, {"step": 5, "loss": 1.0}, t=1.0)  # a late record does not clear the red row
    dash.flush()
    assert "rtnb-state-dead" in row.box._dom_classes and "SIGKILL" in row.metrics.value


def test_a_button_shows_its_result_and_a_refused_click_says_why(dash):
    g = dash.group
    dash.buttons["restart"].click()  # disabled: nothing is called
    assert g.calls == [] and "Restart dead workers cannot act now: no dead worker" in dash.status.value
    g.set_state(GroupState.FAILED, r1="dead")
    dash.buttons["restart"].click()  # a click sees the group as it is now, not as last shown
    assert g.calls == ["restart"] and "restarted rank(s) 1" in dash.status.value


def test_an_error_is_shown_in_the_widget_with_its_message(dash):
    g = dash.group
    g.fail["interrupt"] = GroupError("the workers did not answer within 5 s\nsecond line")
    background = threading.Thread(target=g.set_state, args=(GroupState.RUNNING,),
                                  kwargs={"r0": "running", "r1": "running"})
    background.start()  # a --background cell: the state changes on another thread
    background.join(10)
    assert not background.is_alive(), "set_state on another thread did not return within 10 s"
    dash.buttons["interrupt"].click()
    assert "Interrupt failed: the workers did not answer within 5 s" in dash.status.value
    assert "second line" not in dash.status.value and "#c62828" in dash.status.value


def test_shutdown_closes_the_dashboard(dash):
    dash.buttons["shutdown"].click()
    assert dash.group.calls == ["shutdown"] and dash.closed
    assert all(b.disabled for b in dash.buttons.values())


def test_an_unknown_button_is_refused_by_name():
    with pytest.raises(ValueError, match=r"unknown button 'explode': one of checkpoint, rollback, restart"):
        act(FakeGroup(), "explode")


def test_a_checkpoint_list_that_cannot_be_read_says_why(dash, monkeypatch):
    def broken(kind=None):
        raise OSError("storage is gone")

    monkeypatch.setattr(dash.group, "checkpoints", broken)
    dash.refresh_checkpoints()
    assert "cannot list the checkpoints: storage is gone" in dash.status.value
