"""One sweep dashboard row per trial: id, parameters, state badge, iterations, latest and best metric, how it
ended, and its Stop button.

Only the traits that changed are sent to the front end. Rows carry CSS classes (``rtnb-trial``,
``rtnb-trial-<id>``, ``rtnb-trial-state-<STATE>``, ``rtnb-trial-best``) so a browser test can find them.
"""
from __future__ import annotations

import html
from typing import Any, Callable, List, NamedTuple, Tuple

import ipywidgets as w

from ..dashboard.rows import ONE_LINE
from ..view_helpers import row_cell, state_badge
from .model import ERROR, STATE_COLOURS, SweepModel, TrialRow, format_params, format_value

#: (column, width) of each cell of a row; the Stop button follows.
COLUMNS = (("trial", "130px"), ("params", "230px"), ("state", "112px"), ("iter", "52px"), ("latest", "86px"),
           ("best", "86px"), ("ended", "150px"))
BEST_BACKGROUND = "#fff8e1"


def set_if_changed(widget: Any, name: str, value: Any) -> None:
    """Set a trait only when its value changes: each set is a message to the front end."""
    if getattr(widget, name) != value:
        setattr(widget, name, value)


def header_row(metric: str) -> w.HBox:
    titles = {"latest": metric, "best": f"best {metric}"}
    return w.HBox([row_cell(width, f"<b>{html.escape(titles.get(name, name))}</b>") for name, width in COLUMNS],
                  layout=w.Layout(border_bottom="1px solid #ccc"))


class RowTexts(NamedTuple):
    """What one row shows, as text (HTML), taken from the model under its lock."""

    trial: str
    params: str
    state: str
    iterations: str
    latest: str
    best: str
    ended: str
    enabled: bool
    why: str
    is_best: bool


def row_texts(row: TrialRow, model: SweepModel, is_best: bool, button: Tuple[bool, str]) -> RowTexts:
    """The texts of ``row``'s cells; ``button`` is its Stop button's ``(enabled, tooltip)``."""
    params = html.escape(format_params(row.params, limit=10_000))
    ended = html.escape(model.ended_text(row))
    if row.state == ERROR and row.error:
        ended = f'<span style="color:#c62828;{ONE_LINE}" title="{html.escape(row.error)}">{ended}</span>'
    return RowTexts(
        trial=f"<b>{html.escape(row.trial_id)}</b>" + (" ★" if is_best else ""),
        params=f'<span style="{ONE_LINE}" title="{params}">{html.escape(format_params(row.params, limit=34))}</span>',
        state=row.state, iterations=str(row.iterations), latest=format_value(row.latest),
        best=format_value(row.best), ended=ended, enabled=button[0], why=button[1], is_best=is_best)


class TrialRowWidgets:
    """The widgets of one trial's row; :meth:`update` shows a :class:`TrialRow`.

    Args:
        trial_id: the trial.
        on_stop: called with ``trial_id`` when the Stop button is clicked.
    """

    def __init__(self, trial_id: str, on_stop: Callable[[str], Any]) -> None:
        widths = dict(COLUMNS)
        self.trial_id = trial_id
        self.trial = row_cell(widths["trial"], f"<b>{html.escape(trial_id)}</b>")
        self.params = row_cell(widths["params"])
        self.state = row_cell(widths["state"])
        self.iterations = row_cell(widths["iter"])
        self.latest = row_cell(widths["latest"])
        self.best = row_cell(widths["best"])
        self.ended = row_cell(widths["ended"])
        self.stop = w.Button(description="Stop", icon="stop", layout=w.Layout(width="76px"))
        self.stop.add_class("rtnb-trial-stop")
        self.stop.on_click(lambda _button: on_stop(trial_id))
        self.cells: List[w.HTML] = [self.trial, self.params, self.state, self.iterations, self.latest, self.best,
                                    self.ended]
        self.box = w.HBox(self.cells + [self.stop], layout=w.Layout(align_items="center", padding="1px 0"))
        self.box.add_class("rtnb-trial")
        self.box.add_class(f"rtnb-trial-{trial_id}")
        self._classes: Tuple[str, bool] = ("", False)

    def update(self, texts: "RowTexts") -> None:
        """Show ``texts`` (made by :func:`row_texts` under the model's lock; widgets are set outside it)."""
        set_if_changed(self.trial, "value", texts.trial)
        set_if_changed(self.params, "value", texts.params)
        set_if_changed(self.state, "value", state_badge(texts.state, STATE_COLOURS))
        set_if_changed(self.iterations, "value", texts.iterations)
        set_if_changed(self.latest, "value", texts.latest)
        set_if_changed(self.best, "value", texts.best)
        set_if_changed(self.ended, "value", texts.ended)
        set_if_changed(self.stop, "disabled", not texts.enabled)
        set_if_changed(self.stop, "tooltip", texts.why)
        self._restyle(texts.state, texts.is_best)

    def _restyle(self, state: str, is_best: bool) -> None:
        if self._classes == (state, is_best):
            return
        old_state, old_best = self._classes
        if old_state:
            self.box.remove_class(f"rtnb-trial-state-{old_state}")
        self.box.add_class(f"rtnb-trial-state-{state}")
        if is_best != old_best:
            (self.box.add_class if is_best else self.box.remove_class)("rtnb-trial-best")
            for cell in self.cells:
                cell.style.background = BEST_BACKGROUND if is_best else None
        self._classes = (state, is_best)
