"""What the sweep dashboard shows, as plain data (no widgets, no Tune): trials, curves, the best, button rules.

The widget view (:mod:`.view`) and the text fallback (:mod:`.text`) both render this model, and the
Tune callback (:mod:`.callback`) fills it from Tune's events, so its rules are tested without Tune or
a front end. Trial states are Tune's (``PENDING``, ``RUNNING``, ``PAUSED``, ``TERMINATED``, ``ERROR``).

How a trial ended (``TrialRow.ended_by``): ``finished`` (its function returned), ``tune`` (a scheduler
or a stopper ended it at a report), ``button`` (its Stop button), ``sweep`` (Stop sweep or Ctrl-C),
``error``. It *stopped early* when the dashboard stopped it, or when Tune did before it reached the
most iterations any trial of the sweep reached (a trial that ASHA ends at ``max_t`` did not).
"""
from __future__ import annotations

import dataclasses
import math
import threading
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..dashboard.model import Line
from ..view_helpers import finite_number

PENDING, RUNNING, PAUSED, TERMINATED, ERROR = "PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"
ENDED = (TERMINATED, ERROR)
STATE_COLOURS = {PENDING: "#6c757d", RUNNING: "#1565c0", PAUSED: "#6f42c1", TERMINATED: "#2e7d32",
                 ERROR: "#c62828"}
#: What Tune adds to every result: not metrics worth choosing or plotting.
TUNE_KEYS = frozenset({
    "done", "training_iteration", "timestamp", "time_this_iter_s", "time_total_s", "pid", "date",
    "hostname", "node_ip", "iterations_since_restore", "time_since_restore", "timesteps_total",
    "episodes_total", "timesteps_since_restore", "trial_id", "experiment_id", "experiment_tag", "config",
    "checkpoint_dir_name", "should_checkpoint", "warmup_time"})
MODES = ("min", "max")
SCOPES = ("last", "all")


def format_value(value: Optional[float]) -> str:
    return "" if value is None else f"{value:.4g}"


def format_params(params: Mapping[str, Any], limit: int = 60) -> str:
    """``lr=0.01 batch=32`` (floats to 4 digits), cut to ``limit`` characters."""
    parts = [f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in params.items()]
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclasses.dataclass
class TrialRow:
    """One trial: who it is, its state, and its metric so far."""

    trial_id: str
    name: str = ""
    params: Dict[str, Any] = dataclasses.field(default_factory=dict)
    state: str = PENDING
    iterations: int = 0
    latest: Optional[float] = None
    best: Optional[float] = None
    ended_by: str = ""
    stop_requested: bool = False
    error: str = ""
    points: List[Tuple[float, Dict[str, float]]] = dataclasses.field(default_factory=list, repr=False)

    @property
    def ended(self) -> bool:
        return self.state in ENDED


@dataclasses.dataclass
class StopSituation:
    """What decides whether the Stop buttons can act now.

    Attributes:
        running: a sweep is running (between Tune's ``setup`` and its experiment end).
        clicks_now: the kernel handles a click at once (False while ``tuner.fit()`` holds the cell).
        wired: Tune asks the dashboard's stopper (True), does not (False), or not known yet (None).
    """

    running: bool
    clicks_now: bool = True
    wired: Optional[bool] = None


NOT_RUNNING_WHY = "no sweep is running"
FOREGROUND_WHY = ("the sweep holds this cell (tuner.fit()): the kernel handles a click only after the cell; "
                  "run `results = await dash.fit(tuner)` to stop trials while the sweep runs")
NOT_WIRED_WHY = ("Tune does not ask this dashboard which trials to stop: pass stop=dash.stopper to "
                 "tune.RunConfig (or CombinedStopper(dash.stopper, your_stopper))")


class SweepModel:
    """Everything the sweep dashboard shows (thread-safe: Tune's loop writes, the front ends read).

    Args:
        metric: the metric shown and ranked; None takes ``loss`` if reported, else the first number.
        mode: ``min`` or ``max``; needed with ``metric`` (as in ``tune.TuneConfig``), ``min`` otherwise.
        scope: which value ranks a trial, as ``ResultGrid.get_best_result(scope=...)``: ``last`` (its
            latest value, Tune's default) or ``all`` (its best value).
        max_points: points kept per trial (older halves are thinned, never dropped).
        plot_points: at most this many points per trial are drawn.

    Raises:
        ValueError: an unknown ``mode`` or ``scope``, or ``metric`` without ``mode``.
    """

    def __init__(self, metric: Optional[str] = None, mode: Optional[str] = None, scope: str = "last",
                 max_points: int = 2000, plot_points: int = 400) -> None:
        if mode is not None and mode not in MODES:
            raise ValueError(f"mode={mode!r} is unknown: use 'min' or 'max'")
        if metric is not None and mode is None:
            raise ValueError(f"metric={metric!r} needs a mode: pass mode='min' or mode='max' (as in tune.TuneConfig)")
        if scope not in SCOPES:
            raise ValueError(f"scope={scope!r} is unknown: use 'last' (Tune's default) or 'all'")
        self.lock = threading.RLock()
        self.given_metric = metric
        self.metric: Optional[str] = metric
        self.mode: str = mode or "min"
        self.scope = scope
        self.max_points = max_points
        self.plot_points = plot_points
        self.rows: Dict[str, TrialRow] = {}
        self.running = False
        self.stop_all_requested = False
        self.version = 0  # bumped on every change a front end shows
        self.state_version = 0  # bumped on every change of a trial's state (the text table prints then)

    # -- the sweep -----------------------------------------------------------------------------

    def begin(self) -> None:
        """A sweep starts: forget the last one's trials (the metric, if inferred, is inferred again)."""
        with self.lock:
            self.rows.clear()
            self.metric = self.given_metric
            self.running, self.stop_all_requested = True, False
            self._bump(state=True)

    def end(self) -> None:
        with self.lock:
            self.running = False
            self._bump(state=True)

    def _bump(self, state: bool = False) -> None:
        self.version += 1
        if state:
            self.state_version += 1

    def _row(self, trial_id: str, name: str = "", params: Optional[Mapping[str, Any]] = None) -> TrialRow:
        row = self.rows.get(trial_id)
        if row is None:
            row = self.rows[trial_id] = TrialRow(trial_id=trial_id)
        if name:
            row.name = name
        if params is not None:
            row.params = dict(params)
        return row

    # -- Tune's events -------------------------------------------------------------------------

    def see(self, trial_id: str, state: str, name: str = "", params: Optional[Mapping[str, Any]] = None) -> bool:
        """Tune's own status of a trial (each step); returns whether the trial's state changed."""
        with self.lock:
            new = trial_id not in self.rows
            row = self._row(trial_id, name, params)
            if not new and row.state == state:
                return False
            if state in ENDED and not row.ended_by:
                row.ended_by = "error" if state == ERROR else "sweep" if self.stop_all_requested else "finished"
            row.state = state
            self._bump(state=True)
            return True

    def start(self, trial_id: str, name: str = "", params: Optional[Mapping[str, Any]] = None) -> None:
        with self.lock:
            row = self._row(trial_id, name, params)
            row.state, row.ended_by, row.error = RUNNING, "", ""
            self._bump(state=True)

    def add_result(self, trial_id: str, result: Mapping[str, Any], stopped_by: str = "") -> None:
        """Take one reported result. ``stopped_by``: ``tune`` or ``button`` when Tune decided to stop the
        trial at this result (it came with ``done``), else empty."""
        with self.lock:
            row = self._row(trial_id)
            values = {k: v for k, v in ((k, finite_number(v)) for k, v in result.items() if k not in TUNE_KEYS)
                      if v is not None}
            if self.metric is None and values:
                self.metric = "loss" if "loss" in values else next(iter(values))
            iteration = finite_number(result.get("training_iteration"))
            row.iterations = int(iteration) if iteration is not None else row.iterations + 1
            if row.state == PENDING:
                row.state = RUNNING
            value = values.get(self.metric) if self.metric else None
            if value is not None:
                row.latest = value
                row.best = value if row.best is None else self.better(value, row.best)
            if values:
                row.points.append((float(row.iterations), values))
                if len(row.points) > self.max_points:
                    half = len(row.points) // 2
                    row.points = row.points[:half:2] + row.points[half:]
            if stopped_by:
                row.ended_by = stopped_by
            self._bump()

    def complete(self, trial_id: str) -> None:
        with self.lock:
            row = self._row(trial_id)
            if not row.ended_by:
                row.ended_by = "sweep" if self.stop_all_requested else "finished"
            row.state = TERMINATED
            self._bump(state=True)

    def fail(self, trial_id: str, error: str) -> None:
        with self.lock:
            row = self._row(trial_id)
            row.state, row.ended_by, row.error = ERROR, "error", error
            self._bump(state=True)

    def recover(self, trial_id: str) -> None:
        """A failed trial is retried (``FailureConfig(max_failures=...)``): pending again."""
        with self.lock:
            row = self._row(trial_id)
            row.state, row.ended_by = PENDING, ""
            self._bump(state=True)

    # -- the dashboard's own stops ---------------------------------------------------------------

    def request_stop(self, trial_id: str) -> None:
        with self.lock:
            self._row(trial_id).stop_requested = True
            self._bump()

    def request_stop_all(self) -> None:
        with self.lock:
            self.stop_all_requested = True
            self._bump()

    # -- reading ---------------------------------------------------------------------------------

    def better(self, a: float, b: float) -> float:
        return min(a, b) if self.mode == "min" else max(a, b)

    def score(self, row: TrialRow) -> Optional[float]:
        """The value that ranks ``row`` (its latest, or its best with ``scope='all'``)."""
        return row.latest if self.scope == "last" else row.best

    def best_trial(self) -> Optional[str]:
        """The trial id with the best score, or None before any trial reported the metric."""
        with self.lock:
            scored = [(self.score(r), r.trial_id) for r in self.rows.values() if self.score(r) is not None]
        if not scored:
            return None
        sign = 1.0 if self.mode == "min" else -1.0
        return min(scored, key=lambda s: sign * s[0])[1]

    def max_iterations(self) -> int:
        with self.lock:
            return max((r.iterations for r in self.rows.values()), default=0)

    def stopped_early(self, row: TrialRow) -> bool:
        if row.ended_by in ("button", "sweep"):
            return True
        return row.ended_by == "tune" and row.iterations < self.max_iterations()

    def ended_text(self, row: TrialRow) -> str:
        """The "ended" column: empty while the trial runs."""
        if not row.ended:
            return "stopping…" if row.stop_requested or (self.stop_all_requested and self.running) else ""
        if row.ended_by == "error":
            return "error"
        if row.ended_by in ("button", "sweep"):
            by = "Stop" if row.ended_by == "button" else "Stop sweep"
            return f"stopped early ({by})" if row.iterations else f"not run ({by})"
        if row.ended_by == "tune":
            return "stopped early" if self.stopped_early(row) else "stopped by Tune"
        return "finished"

    def counts(self) -> Dict[str, int]:
        with self.lock:
            out: Dict[str, int] = {}
            for row in self.rows.values():
                out[row.state] = out.get(row.state, 0) + 1
            return out

    def summary(self) -> str:
        """``4 trials: 2 running, 1 terminated, 1 pending · best loss=0.0123 (trial 8c7f2_00002)``."""
        with self.lock:
            n = len(self.rows)
            counts = self.counts()
            states = ", ".join(f"{counts[s]} {s.lower()}" for s in (RUNNING, PAUSED, PENDING, TERMINATED, ERROR)
                               if counts.get(s))
            text = f"{n} trial" + ("" if n == 1 else "s") + (f": {states}" if states else "")
            best = self.best_trial()
            if best is not None:
                text += f" · best {self.metric}={format_value(self.score(self.rows[best]))} (trial {best})"
            elif self.metric:
                text += f" · {self.metric} ({self.mode})"
            return text

    def lines(self) -> Tuple[List[Line], Optional[str]]:
        """Every trial's curve of the metric (the best one last, drawn on top) and the best one's label."""
        with self.lock:
            metric = self.metric
            best = self.best_trial()
            series = [(r.trial_id, [(x, v[metric]) for x, v in r.points if metric in v])
                      for r in self.rows.values()] if metric else []
        series = [(tid, pts) for tid, pts in series if pts]
        series.sort(key=lambda s: s[0] == best)
        out = []
        for tid, pts in series:
            stride = max(1, math.ceil(len(pts) / self.plot_points))
            kept = pts[::stride]
            if kept[-1] is not pts[-1]:
                kept.append(pts[-1])
            out.append(Line(tid, [p[0] for p in kept], [p[1] for p in kept]))
        return out, best


def _blocked(s: StopSituation) -> str:
    """Why no Stop button can act now ("" when they can): the sweep is not running, clicks cannot reach the
    kernel while it runs, or the stopper is not wired."""
    if not s.running:
        return NOT_RUNNING_WHY
    if not s.clicks_now:
        return FOREGROUND_WHY
    if s.wired is False:
        return NOT_WIRED_WHY
    return ""


def stop_state(model: SweepModel, row: TrialRow, s: StopSituation) -> Tuple[bool, str]:
    """``(enabled, tooltip)`` of a trial's Stop button; the tooltip of a disabled one says why."""
    if row.ended:
        return False, f"the trial ended ({model.ended_text(row)})"
    blocked = _blocked(s)
    if blocked:
        return False, blocked
    if row.stop_requested or model.stop_all_requested:
        return False, "stopping: Tune stops it at its next report"
    if row.state == PENDING:
        return True, "stop this trial before it trains: Tune ends it at its first report"
    return True, "stop this trial at its next report (the others go on)"


def sweep_stop_state(model: SweepModel, s: StopSituation) -> Tuple[bool, str]:
    """``(enabled, tooltip)`` of the Stop sweep button."""
    blocked = _blocked(s)
    if blocked:
        return False, blocked
    if model.stop_all_requested:
        return False, "stopping: Tune ends every trial and starts no new one"
    return True, "stop every trial and start no new one (results so far are kept)"
