"""The dashboard's summary of a large group: one line instead of a row per rank, and a way to expand a range.

Beyond :data:`~.model.LARGE` ranks the table shows rows only for the ranks :mod:`.summary` always lists
(failed, dead, unresponsive, slow) and for the ranks the user expanded (``8-15`` in the ranks box, then
Expand; Collapse hides them again). Stock ipywidgets: an HTML line, a Text box and two Buttons, carrying
CSS classes (``rtnb-summary``, ``rtnb-expand-ranks``, ``rtnb-btn-expand``, ``rtnb-btn-collapse``) for the
browser test.
"""
from __future__ import annotations

import html
from typing import Callable, Dict, List, Mapping, Optional

import ipywidgets as w

from .model import STATE_COLOURS, RankView
from .summary import EXPAND_MAX, Summary, is_large, parse_ranks, shown_ranks, summarize
from .sync import assign


def summary_html(summary: Summary) -> str:
    """The summary line: each state's count as a coloured pill, then the rest of :meth:`Summary.text`."""
    pills = "".join(
        f'<span class="rtnb-count rtnb-count-{html.escape(state.replace(" ", "-"))}" '
        f'style="background:{STATE_COLOURS.get(state, "#6c757d")};color:white;padding:1px 8px;'
        f'border-radius:9px;font-size:12px;margin-right:4px">{n} {html.escape(state)}</span>'
        for state, n in summary.counts)
    rest = summary.text().split(" · ", 1)[1:]  # the counts are the pills
    return f'<b>{summary.total} ranks</b> {pills}' + (f" · {html.escape(rest[0])}" if rest else "")


class SummaryPanel:
    """The summary line and the expand controls (``box``, hidden while the group is small).

    Args:
        changed: called after the expanded ranks changed (the dashboard flushes).
    """

    def __init__(self, changed: Callable[[], None]) -> None:
        self._changed = changed
        self.line = w.HTML(value="")
        self.line.add_class("rtnb-summary")
        self.ranks = w.Text(value="", placeholder="e.g. 0-15", description="ranks",
                            layout=w.Layout(width="180px"), style={"description_width": "40px"})
        self.ranks.add_class("rtnb-expand-ranks")
        self.expand_button = w.Button(description="Expand", icon="plus", tooltip=(
            f"show a row for each of these ranks (at most {EXPAND_MAX}); failed, dead and slow ranks are "
            "always shown"), layout=w.Layout(width="auto", margin="2px 4px"))
        self.expand_button.add_class("rtnb-btn-expand")
        self.collapse_button = w.Button(description="Collapse", icon="minus", tooltip="hide the expanded rows",
                                        layout=w.Layout(width="auto", margin="2px 4px"))
        self.collapse_button.add_class("rtnb-btn-collapse")
        self.note = w.HTML(value="")
        self.expand_button.on_click(lambda _b: self._expand_from_box())
        self.collapse_button.on_click(lambda _b: self.collapse())
        self.box = w.VBox([self.line, w.HBox([self.ranks, self.expand_button, self.collapse_button, self.note],
                                             layout=w.Layout(align_items="center"))],
                          layout=w.Layout(display="none"))
        self.box.add_class("rtnb-large")
        self.expanded: List[int] = []
        self.summary: Optional[Summary] = None
        self._n = 0

    def expand(self, ranks: str) -> List[int]:
        """Show a row for each rank of ``ranks`` (``"8-15"``, ``"0,3"``; ``""``: none); returns them.

        Raises:
            ValueError: ``ranks`` is not a range of this group's ranks (one line: the value and the form).
        """
        self.expanded = parse_ranks(ranks, self._n)
        assign(self.note, value="")
        self._changed()
        return list(self.expanded)

    def collapse(self) -> None:
        """Hide the expanded rows (the always-listed ones stay)."""
        self.expanded = []
        self._changed()

    def _expand_from_box(self) -> None:
        try:
            self.expand(self.ranks.value)
        except ValueError as exc:
            assign(self.note, value=f'<span style="color:#c62828">{html.escape(str(exc))}</span>')

    def pick(self, views: Mapping[int, RankView]) -> Dict[int, RankView]:
        """The rows to show of ``views`` (all of them in a small group), showing the summary of a large one."""
        self._n = len(views)
        large = is_large(len(views))
        assign(self.box.layout, display=None if large else "none")
        if not large:
            self.summary = None
            return dict(views)
        self.summary = summarize(views)
        assign(self.line, value=summary_html(self.summary))
        return {r: views[r] for r in shown_ranks(views, self.expanded, self.summary)}
