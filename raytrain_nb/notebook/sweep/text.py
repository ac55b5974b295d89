"""The sweep dashboard's text fallback: a compact table of the trials, printed when a trial's state changes.

Used in a terminal (or with ``RAYTRAIN_NB_UI=text``), as the group dashboard's text lines are. It prints
on a state change (a trial starts, is paused, ends or fails: coalesced to one table per step of Tune's
loop), never per result, and once more when the sweep ends::

    raytrain_nb sweep · 3 trials: 2 running, 1 terminated · best loss=0.0123 (trial 8c7f2_00002)
      trial        state       iter  loss     best     ended          params
      8c7f2_00000  RUNNING        3  0.1234   0.1234                  lr=0.01
      8c7f2_00001  TERMINATED     2  0.5      0.4      stopped early  lr=0.1

Pending trials are counted in the first line, not listed; past ``max_rows`` trials the table keeps the
running ones, the ones that just changed and the best.
"""
from __future__ import annotations

import sys
import threading
from typing import Dict, Iterable, List, Optional, TextIO

from .model import PENDING, RUNNING, SweepModel, TrialRow, format_params, format_value

MAX_ROWS = 12


def _pick(model: SweepModel, rows: List[TrialRow], changed: Iterable[str], max_rows: int) -> List[TrialRow]:
    listed = [r for r in rows if r.state != PENDING]
    if len(listed) <= max_rows:
        return listed
    best = model.best_trial()
    wanted = {r.trial_id for r in listed if r.state == RUNNING} | set(changed) | ({best} if best else set())
    keep = [r for r in listed if r.trial_id in wanted][:max_rows]
    rest = [r for r in listed if r.trial_id not in wanted][: max_rows - len(keep)]
    chosen = {r.trial_id for r in keep + rest}
    return [r for r in listed if r.trial_id in chosen]


def table(model: SweepModel, changed: Iterable[str] = (), max_rows: int = MAX_ROWS) -> List[str]:
    """The lines of the table: a summary line, then one line per listed trial."""
    with model.lock:
        rows = list(model.rows.values())
        metric = model.metric or "metric"
        best = model.best_trial()
        shown = _pick(model, rows, changed, max_rows)
        cells = [["trial", "state", "iter", metric, f"best {metric}", "ended", "params"]]
        for r in shown:
            mark = " *" if r.trial_id == best else ""
            cells.append([r.trial_id + mark, r.state, str(r.iterations), format_value(r.latest),
                          format_value(r.best), model.ended_text(r), format_params(r.params)])
        lines = ["raytrain_nb sweep · " + model.summary()]
    widths = [max(len(row[i]) for row in cells) for i in range(len(cells[0]) - 1)]
    for row in cells:
        parts = [text.rjust(w) if i == 2 else text.ljust(w) for i, (text, w) in enumerate(zip(row, widths))]
        lines.append(("  " + "  ".join(parts) + "  " + row[-1]).rstrip())
    hidden = sum(1 for r in rows if r.state != PENDING) - len(shown)
    if hidden > 0:
        lines.append(f"  … {hidden} more trial(s) not listed")
    return lines


class SweepText:
    """Prints :func:`table` on trial state changes (call :meth:`update` once per step of Tune's loop).

    Args:
        model: the sweep to print.
        stream: where to write (default: ``sys.stdout`` at the time of writing).
        note: a line printed once before the first table (e.g. how to turn Tune's own tables off).
    """

    def __init__(self, model: SweepModel, stream: Optional[TextIO] = None, note: str = "") -> None:
        self.model = model
        self.stream = stream
        self.note = note
        self.tables = 0
        self._lock = threading.Lock()
        self._printed = -1
        self._states: Dict[str, str] = {}

    def _write(self, lines: List[str]) -> None:
        out = self.stream or sys.stdout
        out.write("\n".join(lines) + "\n")
        out.flush()

    def start(self) -> None:
        """A sweep starts: print the note, if any."""
        with self._lock:
            self._printed, self._states = self.model.state_version, {}
            if self.note:
                self._write([self.note])

    def update(self, force: bool = False) -> bool:
        """Print the table if a trial's state changed since the last one (or ``force``); returns whether it printed."""
        with self._lock:
            version = self.model.state_version
            with self.model.lock:
                states = {tid: r.state for tid, r in self.model.rows.items()}
            changed = [tid for tid, st in states.items() if self._states.get(tid) != st and st != PENDING]
            if not force and (version == self._printed or not changed):
                self._printed = version
                return False
            self._printed, self._states = version, states
            self._write(table(self.model, changed))
            self.tables += 1
            return True

    def finish(self) -> None:
        """The sweep ended: the final table."""
        self.update(force=True)
