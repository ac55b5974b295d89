"""What the dashboard shows, as plain data (no widgets): rows, progress, rates, metric series, button rules.

The widget layer (:mod:`.widgets`) and the text fallback (:mod:`.textui`) both render this model,
so its rules are tested without a front end.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import threading
import time
from typing import Any, Deque, Dict, Iterable, List, Optional, Sequence, Tuple

from ..view_helpers import finite_number
from .bands import Bands, Line

#: Badge colours by worker state: a glance tells idle (green), running (blue), failed (orange), dead (red).
STATE_COLOURS = {
    "starting": "#6c757d",
    "idle": "#2e7d32",
    "running": "#1565c0",
    "failed": "#e67e22",
    "dead": "#c62828",
    "unresponsive": "#c62828",
    "recovering": "#6f42c1",
    "shut down": "#6c757d",
}
GONE = ("dead", "unresponsive")
RATE_WINDOW_S = 5.0
STEP_KEYS = ("step", "training_iteration")
#: The plot's pseudo-metric: seconds between a rank's reports.
STEP_TIME = "step time (s)"
#: Beyond this many ranks the dashboard shows a summary and the plot a mean with a min-max band (summary.py).
LARGE = 16
#: Points kept over all ranks of a large group (each rank keeps its share, at least MIN_RANK_POINTS).
TOTAL_POINTS = 64_000
MIN_RANK_POINTS = 200


def n_workers(n: int) -> str:
    """``1 worker``, ``2 workers``."""
    return f"{n} worker" + ("" if n == 1 else "s")


def format_metrics(metrics: Dict[str, Any], limit: int = 80) -> str:
    """``loss=0.1234 acc=0.91`` (the step is shown by the progress column), cut to ``limit``."""
    parts = []
    for key, value in metrics.items():
        if key in STEP_KEYS:
            continue
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclasses.dataclass
class RankView:
    """One row: who the worker is, its state, and its progress in the current cell."""

    rank: int
    node: str = "?"
    pid: int = 0
    device: str = "?"
    state: str = "starting"
    error: str = ""
    step: Optional[float] = None
    total: Optional[int] = None
    reports: int = 0
    rate: Optional[float] = None
    metrics: Dict[str, Any] = dataclasses.field(default_factory=dict)
    last_time: float = 0.0
    resources: Dict[str, Any] = dataclasses.field(default_factory=dict)  # cpu, rss, gpu... (group/vitals.py)
    step_time: Optional[float] = None
    slow: bool = False
    _window: Deque[Tuple[float, float]] = dataclasses.field(default_factory=collections.deque, repr=False)

    @property
    def done(self) -> float:
        """Steps finished in this cell: a reported ``step`` is the 0-based index of the step just done."""
        if self.step is not None:
            return self.step + 1
        return float(self.reports)

    def progress(self) -> Tuple[int, int, str]:
        """``(value, max, text)`` for a progress bar; without a total the bar is full and says so."""
        done = int(self.done)
        if self.total:
            value = max(0, min(done, self.total))
            return value, self.total, f"{value}/{self.total}"
        if self.reports == 0:
            return 0, 1, ""
        return 1, 1, f"step {done}" if self.step is not None else f"{done} reports"

    def rate_text(self) -> str:
        if self.rate is None:
            return ""
        return f"{self.rate:,.0f} steps/s" if self.rate >= 100 else f"{self.rate:.3g} steps/s"

    def add(self, record: Dict[str, Any], total: Optional[int], count: int = 1) -> None:
        """Take ``record``, the latest of ``count`` new reports of this rank."""
        metrics = record.get("metrics", {})
        self.metrics = dict(metrics)
        self.reports += count
        step = next((finite_number(metrics[k]) for k in STEP_KEYS if k in metrics), None)
        self.step = step if step is not None else None
        if record.get("total") is not None:
            self.total = int(record["total"])
        elif self.total is None and total:
            self.total = total
        t = float(record.get("time", time.time()))
        self.last_time = t
        self._window.append((t, self.done))
        while len(self._window) > 2 and t - self._window[0][0] > RATE_WINDOW_S:
            self._window.popleft()
        (t0, d0), (t1, d1) = self._window[0], self._window[-1]
        self.rate = (d1 - d0) / (t1 - t0) if t1 > t0 and d1 >= d0 else self.rate

    def new_cell(self, total: Optional[int]) -> None:
        self.step, self.total, self.reports, self.rate = None, total, 0, None
        self._window.clear()


class Series:
    """A rank's metrics over steps, capped at ``max_points`` (older halves are thinned, never dropped)."""

    def __init__(self, max_points: int) -> None:
        self.max_points = max_points
        self.points: List[Tuple[float, Dict[str, float]]] = []
        self._offset = 0.0  # steps restart at 0 in a new cell: keep x increasing across cells
        self._last_x: Optional[float] = None
        self._cell_start = True
        self.count = 0  # reports seen: the x of reports without a step
        self._last_t: Optional[float] = None  # when the last report was made (step time: the time since)

    def new_cell(self) -> None:
        self._cell_start = True

    def add(self, record: Dict[str, Any]) -> Optional[Tuple[float, Dict[str, float]]]:
        """Take one report; returns its point ``(x, finite values)``, or None when it has no number."""
        metrics = record.get("metrics", {})
        values = {}
        raw = None
        for k, v in metrics.items():
            if type(v) in (float, int) and v == v and v not in (math.inf, -math.inf):  # fast: plain finite numbers
                if k in STEP_KEYS:
                    raw = float(v) if raw is None else raw
                else:
                    values[k] = float(v)
        t = record.get("time")
        if isinstance(t, (int, float)) and self._last_t is not None and not self._cell_start and t > self._last_t:
            values[STEP_TIME] = float(t) - self._last_t  # the plot can show step time per rank
        self._last_t = float(t) if isinstance(t, (int, float)) else None
        x = float(self.count) if raw is None else raw
        self.count += 1
        if self._cell_start and self._last_x is not None and x + self._offset <= self._last_x:
            self._offset = self._last_x + 1 - x
        self._cell_start = False
        x += self._offset
        self._last_x = x
        if values:
            self.points.append((x, values))
        if len(self.points) > self.max_points:
            half = len(self.points) // 2
            self.points = self.points[:half:2] + self.points[half:]
        return (x, values) if values else None


class DashboardModel:
    """Everything the dashboard shows, updated from the group's observers (thread-safe)."""

    def __init__(self, max_points: int = 4000, plot_points: int = 500) -> None:
        self.lock = threading.RLock()
        self.rows: Dict[int, RankView] = {}
        self.series: Dict[int, Series] = {}
        self.metric_keys: List[str] = []
        self.max_points = max_points
        self.plot_points = plot_points
        self.pending_total: Optional[int] = None
        self.cell_total: Optional[int] = None
        self.version = 0  # bumped on every new point (the plot re-renders when it changed)
        self.bands = Bands(max_points)  # every rank's points folded into mean, min and max per step

    def expect_steps(self, total: Optional[int]) -> None:
        """The total for the next cell's progress bars (``--steps N``), unless ``report(total=)`` says."""
        with self.lock:
            self.pending_total = total

    def begin_cell(self) -> None:
        with self.lock:
            self.cell_total, self.pending_total = self.pending_total, None
            for row in self.rows.values():
                row.new_cell(self.cell_total)
            for series in self.series.values():
                series.new_cell()

    def set_workers(self, statuses: Sequence[Any]) -> None:
        """Take rank, node, pid, device, state and error from :class:`WorkerStatus` rows."""
        with self.lock:
            ranks = set()
            for st in statuses:
                row = self.rows.get(st.rank)
                if row is None or (row.pid and st.pid and row.pid != st.pid):  # new or replaced worker
                    old = row
                    row = self.rows[st.rank] = RankView(rank=st.rank)
                    if old is not None:  # a replacement keeps the cell's progress shape
                        row.total = old.total
                row.node, row.pid, row.device = st.node, st.pid, st.device + (f" {st.shard}" if st.shard else "")
                row.state, row.error = st.state, st.error
                row.resources = dict(getattr(st, "resources", None) or {})
                row.step_time, row.slow = getattr(st, "step_time", None), bool(getattr(st, "slow", False))
                ranks.add(st.rank)
            for rank in set(self.rows) - ranks:
                del self.rows[rank]

    def add_records(self, records: Iterable[Dict[str, Any]]) -> List[int]:
        """Add reported metrics; returns the ranks whose rows changed."""
        by_rank: Dict[Any, List[Dict[str, Any]]] = {}
        for rec in records:
            by_rank.setdefault(rec.get("rank"), []).append(rec)
        with self.lock:
            for rank, recs in by_rank.items():
                row = self.rows.get(rank)
                if row is None:
                    row = self.rows[rank] = RankView(rank=rank)
                last = recs[-1]
                if any(r.get("total") is not None for r in recs) and last.get("total") is None:
                    last = dict(last, total=next(r["total"] for r in reversed(recs) if r.get("total") is not None))
                if len(recs) > 1:  # the batch's first report starts the rate's window: one batch has a rate
                    row.add(recs[0], self.cell_total)
                row.add(last, self.cell_total, count=len(recs) - (len(recs) > 1))  # a row shows a batch's latest
                series = self.series.get(rank)
                if series is None:
                    series = self.series[rank] = Series(self._rank_points())
                for rec in recs:
                    point = series.add(rec)
                    if point is not None:
                        self.bands.add(*point)
                for key, value in last.get("metrics", {}).items():
                    if key not in STEP_KEYS and key not in self.metric_keys and finite_number(value) is not None:
                        self.metric_keys.append(key)
                if STEP_TIME not in self.metric_keys and series.points and STEP_TIME in series.points[-1][1]:
                    self.metric_keys.append(STEP_TIME)
            if by_rank:
                self.version += 1
        return list(by_rank)

    def _rank_points(self) -> int:
        """Points a rank's series keeps: ``max_points``, or in a large group its share of ``TOTAL_POINTS``."""
        ranks = max(len(self.rows), len(self.series) + 1)
        if ranks <= LARGE:
            return self.max_points
        return max(MIN_RANK_POINTS, min(self.max_points, TOTAL_POINTS // ranks))

    def default_metric(self) -> Optional[str]:
        with self.lock:
            if "loss" in self.metric_keys:
                return "loss"
            return self.metric_keys[0] if self.metric_keys else None

    def lines(self, metric: Optional[str], mean: bool = False) -> List[Line]:
        """The plot's lines for ``metric``: one per rank, or their mean at each step; beyond ``LARGE`` ranks
        (either way) their mean with a min-max band, read from :attr:`bands` (its cost does not grow with ranks)."""
        if metric is None:
            return []
        with self.lock:
            if len(self.series) > LARGE:
                band = self.bands.line(metric, len(self.series), self.plot_points)
                return [band] if band is not None else []
            per_rank = {r: [(x, v[metric]) for x, v in s.points if metric in v] for r, s in sorted(self.series.items())}
        per_rank = {r: pts for r, pts in per_rank.items() if pts}
        if mean and per_rank:
            sums: Dict[float, List[float]] = {}
            for pts in per_rank.values():
                for x, y in pts:
                    sums.setdefault(x, []).append(y)
            pts = sorted((x, sum(ys) / len(ys)) for x, ys in sums.items())
            per_rank = {-1: pts}
        out = []
        for rank, pts in per_rank.items():
            stride = max(1, math.ceil(len(pts) / self.plot_points))
            kept = pts[::stride]
            if kept[-1] is not pts[-1]:
                kept.append(pts[-1])
            out.append(Line("mean" if rank == -1 else f"rank {rank}", [p[0] for p in kept], [p[1] for p in kept]))
        return out


@dataclasses.dataclass
class Situation:
    """What decides which buttons can act now."""

    group_state: str
    foreground: bool = False  # the kernel is busy in a foreground cell or a button action
    background: bool = False  # a --background cell is running
    gone: Sequence[int] = ()
    num_workers: int = 0
    rescale_to: int = 0
    checkpoints: int = 0
    selected: Optional[Tuple[str, str]] = None  # (name, kind) of the selected checkpoint


BUTTONS = ("checkpoint", "rollback", "restart", "rescale", "interrupt", "shutdown")
FOREGROUND_WHY = ("a cell is running in the foreground: the buttons work between cells and during "
                  "%%distributed --background cells (a click now would only act after the cell)")


def button_states(s: Situation) -> Dict[str, Tuple[bool, str]]:
    """``{button: (enabled, tooltip)}``; the tooltip of a disabled button says why."""
    if s.group_state == "shut down":
        why = "the group was shut down: a new %%distributed cell starts another"
        return {b: (False, why) for b in BUTTONS}
    if s.foreground:
        return {b: (False, FOREGROUND_WHY) for b in BUTTONS}
    dead = ", ".join(map(str, s.gone))
    busy = s.background or s.group_state in ("running", "recovering")
    bg_why = "a background cell is running: Interrupt it (or %dist_wait for it) first"
    dead_why = f"rank(s) {dead} are dead: Restart dead workers, or Rescale, first"
    out: Dict[str, Tuple[bool, str]] = {}
    if s.gone:
        out["checkpoint"] = (False, dead_why)
    elif busy:
        out["checkpoint"] = (True, "snapshot the warm state at the next report() of every rank")
    else:
        out["checkpoint"] = (True, "snapshot the warm state of every rank (models, optimizers, RNG)")
    if not s.checkpoints:
        out["rollback"] = (False, "no checkpoint yet: take one with Checkpoint")
    elif s.selected is None:
        out["rollback"] = (False, "select a checkpoint in the list")
    elif s.selected[1] != "snapshot":
        out["rollback"] = (False, f"{s.selected[0]} is a reported checkpoint (your own files): load it in a "
                                  "cell with raytrain_nb.get_checkpoint(); Rollback takes snapshots")
    elif busy:
        out["rollback"] = (False, bg_why)
    elif s.gone:
        out["rollback"] = (False, dead_why)
    else:
        out["rollback"] = (True, f"load {s.selected[0]} into the same objects on every rank")
    if busy:
        out["restart"] = (False, bg_why)
    elif not s.gone:
        out["restart"] = (False, "no dead worker: every rank is alive")
    else:
        out["restart"] = (True, f"replace rank(s) {dead}; they get the state of a live peer")
    if busy:
        out["rescale"] = (False, bg_why)
    elif s.rescale_to < 1:
        out["rescale"] = (False, "give a number of workers of at least 1")
    elif s.rescale_to == s.num_workers and not s.gone:
        out["rescale"] = (False, f"the group already has {n_workers(s.num_workers)}")
    else:
        out["rescale"] = (True, f"grow or shrink the group to {n_workers(s.rescale_to)}, keeping the warm state")
    out["interrupt"] = ((True, "interrupt the background cell on every rank") if busy
                        else (False, "nothing is running"))
    out["shutdown"] = ((False, bg_why) if busy else (True, "stop the workers and free their resources"))
    return out
