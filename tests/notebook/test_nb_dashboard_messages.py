"""The dashboard's widget messages in a real Jupyter kernel: a no-op ``%%distributed`` cell sends none.

Every iopub message the client reads is counted, whatever its parent: the dashboard's timer thread sends its
updates outside the cell's request, and they must be counted too.
"""
from __future__ import annotations

import collections
import contextlib
from typing import Any, Dict, Iterator

import pytest

from ..waiting import wait_for
from .nbkernel import START_TIMEOUT_S

pytestmark = pytest.mark.notebook

WIDGET = "application/vnd.jupyter.widget-view+json"
#: Brings the widgets in line now, as the timer thread does within 100 ms: what it sends is counted with the cell.
FLUSH = "_rt.active_group().dashboard().flush()"
#: A cell that runs this long is shown as running (raytrain_nb.notebook.dashboard.sync): a load spike can do that.
SHOWN_S = 0.1
ATTEMPTS = 5


@contextlib.contextmanager
def _iopub_types(kernel) -> Iterator[collections.Counter]:
    """Counts, by type, every iopub message the kernel's client reads meanwhile (whatever its parent)."""
    counts: collections.Counter = collections.Counter()
    read = kernel.kc.get_iopub_msg

    def counting(*args: Any, **kwargs: Any) -> Dict[str, Any]:
        msg = read(*args, **kwargs)
        counts[msg["msg_type"]] += 1
        return msg

    kernel.kc.get_iopub_msg = counting
    try:
        yield counts
    finally:
        kernel.kc.get_iopub_msg = read


@pytest.fixture(scope="module")
def nb(kernel):
    cell = kernel.ok("%%distributed --workers 2\nimport raytrain_nb as train", timeout=START_TIMEOUT_S)
    assert [d for d in cell.displays if WIDGET in d], "the first cell shows the dashboard"
    kernel.ok("import raytrain_nb as _rt")
    wait_for(lambda: kernel.ok("_rt.active_group().dashboard().renders").value != "0", 120,
             "the dashboard's first (empty) plot, drawn once at the start", interval=0.2)
    kernel.ok("%%distributed\npass")  # a first no-op cell after a start may move the bars back to 0
    kernel.ok(FLUSH)
    return kernel


def _busy_s(cell) -> float:
    """How long the kernel was busy with ``cell``: from its busy to its idle status, on the kernel's clock."""
    at = {m.content["execution_state"]: m.t for m in cell.of("status")}
    return at["idle"] - at["busy"]


def test_a_no_op_cell_with_the_dashboard_shown_sends_no_widget_message(nb):
    for _ in range(ATTEMPTS):
        with _iopub_types(nb) as quiet:  # each cell is read up to its idle status, the last one's after a flush
            cells = [nb.ok(code) for code in ("%%distributed\npass", "%%distributed\npass", FLUSH)]
        if all(_busy_s(c) < SHOWN_S for c in cells[:2]):
            break  # else a load spike made a cell run so long that it is shown as running, by design: again
    else:
        raise AssertionError(f"in {ATTEMPTS} tries a no-op cell always ran over {SHOWN_S * 1e3:.0f} ms "
                             "(a loaded machine)")
    assert quiet["comm_msg"] == 0, f"widget messages from no-op cells: {dict(quiet)}"
    assert quiet["execute_input"] == 3
    with _iopub_types(nb) as shown:  # the count is live: a report moves the bars
        for code in ("%%distributed\ntrain.report({'step': 0, 'loss': 1.0})", FLUSH):
            nb.ok(code)
    assert shown["comm_msg"] > 0, f"a report that moves the bars sends widget messages: {dict(shown)}"
