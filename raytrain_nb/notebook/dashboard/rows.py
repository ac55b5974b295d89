"""The dashboard's table: one row per rank: rank, node, pid, device, state badge, progress bar, steps/s, metrics.

A dead (or unresponsive) worker's row turns red, with the cause in place of its metrics, and
stays so until the worker is replaced: nothing but a new worker state clears it. Rows carry CSS
classes (``rtnb-rank-N``, ``rtnb-state-STATE``) so a browser test can find them.
"""
from __future__ import annotations

import html
from typing import Dict, Iterable, List, Optional

import ipywidgets as w

from ..view_helpers import row_cell, state_badge
from ..._internal.group.vitals import resources_text, step_text
from .model import GONE, STATE_COLOURS, RankView, format_metrics
from .sync import assign, count

#: (column, width) of each cell of a row.
COLUMNS = (("rank", "44px"), ("node", "110px"), ("pid", "64px"), ("device", "58px"), ("state", "104px"),
           ("progress", "180px"), ("done", "84px"), ("rate", "92px"), ("resources", "230px"), ("metrics", "340px"))
BAR_STYLES = {"running": "info", "idle": "success", "failed": "warning", "dead": "danger",
              "unresponsive": "danger"}
TEXT_INTERVAL_S = 0.5
DEAD_BACKGROUND = "#fdecea"
#: Messages a new row costs the front end (a model opened for each widget, its layout and its style).
ROW_MESSAGES = 3 * len(COLUMNS) + 2
#: A long cause or metrics line stays one line (cut with an ellipsis); the tooltip has all of it.
ONE_LINE = "display:block;white-space:nowrap;overflow:hidden;text-overflow:ellipsis"


def header_row() -> w.HBox:
    """The column titles."""
    cells: List[w.Widget] = []
    for name, width in COLUMNS:
        title = {"done": "steps", "rate": "speed", "metrics": "latest metrics"}.get(name, name)
        cells.append(row_cell(width, f"<b>{title}</b>"))
    return w.HBox(cells, layout=w.Layout(border_bottom="1px solid #ccc"))


class RowWidgets:
    """The widgets of one rank's row; :meth:`update` shows a :class:`RankView`."""

    def __init__(self, rank: int) -> None:
        widths = dict(COLUMNS)
        self.rank = row_cell(widths["rank"], f"<b>{rank}</b>")
        self.node = row_cell(widths["node"])
        self.pid = row_cell(widths["pid"])
        self.device = row_cell(widths["device"])
        self.state = row_cell(widths["state"])
        self.state.add_class("rtnb-state")
        self.bar = w.IntProgress(value=0, min=0, max=1, layout=w.Layout(width=widths["progress"],
                                                                          margin="0 4px 0 0"))
        self.bar.add_class("rtnb-progress")
        self.done = row_cell(widths["done"])
        self.rate = row_cell(widths["rate"])
        self.resources = row_cell(widths["resources"])
        self.resources.add_class("rtnb-resources")
        self.metrics = row_cell(widths["metrics"])
        self.metrics.add_class("rtnb-metrics")
        self.cells = [self.rank, self.node, self.pid, self.device, self.state, self.done, self.rate,
                      self.resources, self.metrics]
        self.box = w.HBox([self.rank, self.node, self.pid, self.device, self.state, self.bar, self.done,
                           self.rate, self.resources, self.metrics],
                          layout=w.Layout(align_items="center", padding="1px 0"))
        self.box.add_class("rtnb-row")
        self.box.add_class(f"rtnb-rank-{rank}")
        self._state = ""
        self._texts_at = float("-inf")

    def update(self, view: RankView, now: float, full: bool = True) -> bool:
        """Show ``view``; only the traits whose value differs are sent to the front end.

        With ``full=False`` (reports, not a change of worker) the text cells follow at most every
        ``TEXT_INTERVAL_S`` (``now`` on the dashboard's clock): each cell update is a message to the
        front end and CPU on the training machine.

        Returns:
            True when text cells were held back (a later update is to show them).
        """
        value, maximum, text = view.progress()
        style = BAR_STYLES.get(view.state, "") if view.total or view.state in GONE else "info"
        if maximum < self.bar.value:  # the value first: it must stay within the new maximum
            assign(self.bar, value=value, max=maximum, bar_style=style)
        else:
            assign(self.bar, max=maximum, value=value, bar_style=style)
        if not full and now - self._texts_at < TEXT_INTERVAL_S:
            return True
        self._texts_at = now
        assign(self.node, value=html.escape(view.node))
        assign(self.pid, value=str(view.pid or ""))
        assign(self.device, value=html.escape(view.device))
        if view.state != self._state:
            self._restyle(view.state)
        assign(self.done, value=text)
        assign(self.rate, value=view.rate_text())
        assign(self.resources, value=resources_cell(view))
        if view.state in GONE or (view.state == "failed" and view.error):
            cause = view.error or "the worker process is gone"
            metrics = (f'<span style="color:#c62828;{ONE_LINE}" title="{html.escape(cause)}">'
                       f'{html.escape(cause)}</span>')
        else:
            every = format_metrics(view.metrics, limit=10_000)
            metrics = (f'<span style="{ONE_LINE}" title="{html.escape(every)}">'
                       f'{html.escape(format_metrics(view.metrics))}</span>')
        assign(self.metrics, value=metrics)
        return False

    def _restyle(self, state: str) -> None:
        with self.box.hold_sync():  # both classes in one message
            if self._state:
                self.box.remove_class(f"rtnb-state-{self._state}")
            self.box.add_class(f"rtnb-state-{state}")
        count(1)
        self._state = state
        assign(self.state, value=state_badge(state, STATE_COLOURS))
        gone = state in GONE
        for cell in self.cells:
            assign(cell.style, background=DEAD_BACKGROUND if gone else None)
        assign(self.box.layout, border_left="4px solid #c62828" if gone else "4px solid transparent")


def resources_cell(view: RankView) -> str:
    """The resources column: CPU, RSS, GPU, the step time; a memory flag and a slow rank in orange."""
    text, step = resources_text(view.resources), step_text(view.step_time, view.slow)
    colour = "#e67e22" if view.slow or view.resources.get("mem_flag") else "inherit"
    line = " · ".join(p for p in (text, step) if p)
    return (f'<span class="{"rtnb-slow" if view.slow else ""}" style="color:{colour};{ONE_LINE}" '
            f'title="{html.escape(line)}">{html.escape(line)}</span>')


class RowTable:
    """The header and one :class:`RowWidgets` per rank, in rank order (``box``)."""

    def __init__(self) -> None:
        self.rows: Dict[int, RowWidgets] = {}
        self.header = header_row()
        self.box = w.VBox([self.header])
        self.box.add_class("rtnb-rows")

    def show(self, views: Dict[int, RankView], reported: Optional[Iterable[int]], now: float) -> List[int]:
        """Show ``views`` (a row per rank): every row in full, or with ``reported`` only those ranks' reports.

        Returns:
            The ranks whose text cells were held back (a later call is to show them).
        """
        order = sorted(views)
        if order != sorted(self.rows):
            for rank in set(self.rows) - set(order):
                del self.rows[rank]
            for rank in order:
                if rank not in self.rows:
                    self.rows[rank] = RowWidgets(rank)
                    count(ROW_MESSAGES)
            self.box.children = [self.header] + [self.rows[r].box for r in order]
            count(1)
        shown = order if reported is None else [r for r in reported if r in views]
        return [r for r in shown if self.rows[r].update(views[r], now, full=reported is None)]
