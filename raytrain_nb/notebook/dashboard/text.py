"""The dashboard's text fallback: one status line per report, for front ends without widgets.

Used in a plain terminal IPython (or with ``RAYTRAIN_NB_UI=text``). Lines, not redrawn bars,
so they survive being interleaved with the workers' own output::

    raytrain_nb [rank 0] 40/100  21.5 steps/s  loss=0.1234
    raytrain_nb [rank 1] dead: the worker process ... was killed: %dist_restart replaces it

A rank reporting faster than ``min_interval_s`` gets a line for its latest report at most that
often (and always for the last report of a cell).

Beyond 16 ranks a line per rank is a flood: the reports then print one summary line (:mod:`.summary`) at most
every ``summary_interval_s`` and at the end of a cell; dead and slow ranks still get their own lines, and
:meth:`TextReporter.expand` follows a range of ranks line by line::

    raytrain_nb 64 workers: 63 running, 1 dead · steps 40-52/100 · slowest 12 (3.1/s), ... · look at 7
"""
from __future__ import annotations

import sys
import threading
import time
import weakref
from typing import Any, Dict, Optional, Set, TextIO

from ..._internal.group.vitals import SLOW_FACTOR, resources_text, step_text
from .model import GONE, DashboardModel, format_metrics
from .summary import is_large, parse_ranks, summarize

_REPORTERS: "weakref.WeakKeyDictionary[Any, TextReporter]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def reporter_for(group: Any, stream: Optional[TextIO] = None) -> "TextReporter":
    """The text reporter of ``group`` (made on first use)."""
    with _LOCK:
        rep = _REPORTERS.get(group)
        if rep is None:
            rep = _REPORTERS[group] = TextReporter(group, stream)
        return rep


def existing_reporter(group: Any) -> Optional["TextReporter"]:
    return _REPORTERS.get(group)


class TextReporter:
    """Prints status lines for a group's reports and worker failures.

    Args:
        group: the group to follow.
        stream: where to write (default: ``sys.stdout`` at the time of writing).
        min_interval_s: at most one line per rank this often.
    """

    def __init__(self, group: Any, stream: Optional[TextIO] = None, min_interval_s: float = 0.5,
                 summary_interval_s: float = 2.0) -> None:
        self.group = group
        self.stream = stream
        self.min_interval_s = min_interval_s
        self.summary_interval_s = summary_interval_s
        self.expanded: Set[int] = set()  # ranks of a large group followed line by line
        self._summary_at = float("-inf")
        self._summary_held = False
        self.model = DashboardModel()
        self._lock = threading.Lock()
        self._printed: Dict[int, float] = {}
        self._held: Dict[int, bool] = {}
        self._states: Dict[int, str] = {}
        self._slow: Set[int] = set()
        group.subscribe(self._on_state)
        group.subscribe_metrics(self._on_metrics)
        self.model.set_workers(group.status(ping=False))
        self._states = {r: v.state for r, v in self.model.rows.items()}

    def expect_steps(self, total: Optional[int]) -> None:
        self.model.expect_steps(total)

    def _write(self, line: str) -> None:
        out = self.stream or sys.stdout
        out.write(line + "\n")
        out.flush()

    def _line(self, rank: int) -> str:
        view = self.model.rows[rank]
        _, _, done = view.progress()
        parts = [f"raytrain_nb [rank {rank}]", done or "-"]
        if view.rate is not None:
            parts.append(view.rate_text())
        metrics = format_metrics(view.metrics)
        if metrics:
            parts.append(metrics)
        used = resources_text(view.resources)
        if used:
            parts.append(used)
        if view.slow:
            parts.append(f"SLOW ({step_text(view.step_time, False)}, above {SLOW_FACTOR:g}x its peers' median)")
        return "  ".join(parts)

    def expand(self, ranks: str) -> Set[int]:
        """In a large group, follow ``ranks`` (``"8-15"``; ``""``: none) line by line; prints their lines now.

        Raises:
            ValueError: ``ranks`` is not a range of the group's ranks.
        """
        with self._lock:
            self.expanded = set(parse_ranks(ranks, len(self.model.rows)))
            for rank in sorted(self.expanded):
                self._write(self._line(rank))
            return set(self.expanded)

    def _summary(self, now: float) -> None:
        self._summary_at, self._summary_held = now, False
        with self.model.lock:
            summary = summarize(self.model.rows)
        self._write(f"raytrain_nb {summary.text()}")

    def _on_metrics(self, records: Any) -> None:
        changed = self.model.add_records(records)
        now = time.monotonic()
        with self._lock:
            if is_large(len(self.model.rows)):  # one summary line, and lines only for the ranks followed
                if now - self._summary_at >= self.summary_interval_s:
                    self._summary(now)
                else:
                    self._summary_held = True
                changed = [r for r in changed if r in self.expanded]
            for rank in changed:
                last = self._printed.get(rank)
                if last is None or now - last >= self.min_interval_s:
                    self._printed[rank] = now
                    self._held[rank] = False
                    self._write(self._line(rank))
                else:
                    self._held[rank] = True

    def _on_state(self, old: Any, new: Any) -> None:
        if new.value == "running" and old.value != "running":
            self.model.begin_cell()
        with self._lock:
            if new.value in ("idle", "failed"):  # the cell ended: the last report of each rank
                for rank, held in list(self._held.items()):
                    if held and rank in self.model.rows:
                        self._held[rank] = False
                        self._write(self._line(rank))
            self.model.set_workers(self.group.status(ping=False))
            if new.value in ("idle", "failed") and self._summary_held:  # a large group's last summary of the cell
                self._summary(time.monotonic())
            for rank, view in sorted(self.model.rows.items()):
                before = self._states.get(rank)
                self._states[rank] = view.state
                if view.state != before and view.state in GONE:
                    cause = view.error or "the worker process is gone"
                    self._write(f"raytrain_nb [rank {rank}] {view.state}: {cause} (%dist_restart replaces it)")
                if view.slow and rank not in self._slow:
                    self._write(f"raytrain_nb [rank {rank}] slow: {step_text(view.step_time, False)}, above "
                                f"{SLOW_FACTOR:g}x its peers' median step time (%dist_where shows where it is)")
            self._slow = {r for r, v in self.model.rows.items() if v.slow}
