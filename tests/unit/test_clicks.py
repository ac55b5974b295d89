"""Stale clicks: a click that waited behind a busy kernel is dropped; a later one is not."""
from __future__ import annotations

import datetime

from raytrain_nb.notebook.dashboard.clicks import ClickGuard


def _msg(sent: float, session: str = "tab", msg_type: str = "comm_msg", date=True):
    header = {"msg_type": msg_type, "session": session}
    if date:
        header["date"] = datetime.datetime.fromtimestamp(sent, tz=datetime.timezone.utc)
    return {"header": header}


def _guard(offset: float = 5.0) -> ClickGuard:
    """A guard whose client clock is ``offset`` s behind the kernel's (learnt from an idle request)."""
    g = ClickGuard()
    g.sample(_msg(1000.0 - offset, msg_type="execute_request"), now=1000.001)
    return g


def test_a_click_sent_during_a_busy_cell_is_stale_when_handled_after_it():
    g = _guard()
    g.begin(now=1010.0)
    g.end(now=1020.0)
    assert g.stale(_msg(1015.0 - 5.0), now=1020.01)  # clicked mid-cell, handled after it
    assert not g.stale(_msg(1020.5 - 5.0), now=1020.6)  # clicked after the cell ended


def test_a_click_queued_behind_a_cell_that_had_not_started_is_stale_too():
    g = _guard()
    g.begin(now=1010.0)  # e.g. a %%distributed cell waiting behind another one when clicked at 1005
    g.end(now=1030.0)
    assert g.stale(_msg(1005.0 - 5.0), now=1030.01)


def test_clicks_not_from_a_front_end_are_never_stale():
    g = _guard()
    g.begin(now=1010.0)
    g.end(now=1020.0)
    assert not g.stale(None, now=1020.01)  # Button.click() in a script or a test
    assert not g.stale(_msg(1015.0, msg_type="execute_request"), now=1020.01)  # .click() in a cell


def test_nested_busy_stretches_count_once():
    g = _guard()
    g.begin(now=1010.0)
    g.begin(now=1011.0)  # a button action inside a cell
    g.end(now=1012.0)
    assert not g.stale(_msg(1011.5 - 5.0), now=1011.6 + 0.0)  # the stretch has not ended yet
    g.end(now=1020.0)
    assert g.stale(_msg(1011.5 - 5.0), now=1020.01)
    g.end(now=1030.0)  # an unmatched end is ignored
    assert not g.stale(_msg(1021.0 - 5.0), now=1030.01)


def test_the_offset_is_the_smallest_delay_seen_per_session():
    g = ClickGuard()
    g.sample(_msg(990.0, msg_type="execute_request"), now=1000.0)  # queued 10 s: a poor sample
    g.sample(_msg(996.0, msg_type="execute_request"), now=1000.0)  # handled at once: offset 4
    g.begin(now=1001.0)
    g.end(now=1003.0)
    assert not g.stale(_msg(1003.5 - 4.0), now=1003.6)
    assert g.stale(_msg(1002.0 - 4.0), now=1003.1)
    # another session (tab) of the same browser: the known offset serves
    assert g.stale(_msg(1002.0 - 4.0, session="other"), now=1003.1)


def test_without_a_date_a_click_right_after_a_busy_stretch_is_stale():
    g = ClickGuard()
    g.begin(now=1000.0)
    g.end(now=1001.0)
    assert g.stale(_msg(0, date=False), now=1001.5)
    assert not g.stale(_msg(0, date=False), now=1003.0)


def test_iso_date_strings_are_understood():
    g = _guard()
    g.begin(now=1010.0)
    g.end(now=1020.0)
    msg = _msg(0)
    msg["header"]["date"] = datetime.datetime.fromtimestamp(1010.0, tz=datetime.timezone.utc).isoformat() \
        .replace("+00:00", "Z")
    assert g.stale(msg, now=1020.01)
    msg["header"]["date"] = "not a date"
    assert g.stale(msg, now=1020.5)  # treated as undated: right after the stretch
