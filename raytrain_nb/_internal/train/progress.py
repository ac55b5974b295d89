"""What ``fit()`` shows while it runs: one progress line per report, and worker output by rank.

:class:`ReportCollector` turns the group's per-rank metric records into complete reports (every
rank reported report ``i``) and hands each to its listeners: the progress line, the callbacks and
the elastic growth check. :class:`ProgressLine` is a ``tqdm.auto`` bar in a terminal or a
notebook (the step, rank 0's metrics, the mean over ranks of the loss-like numbers, steps/s and
the worker count); when stderr is not a terminal (a log file, CI) it writes one plain line per
report instead (at most :data:`MAX_LINES_PER_S` a second; the last one is always written). :class:`TrainSink` prefixes worker output
with ``[rank N]`` and writes it above the bar.
"""
from __future__ import annotations

import logging
import sys
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..output import Labeller, OutputSink

logger = logging.getLogger(__name__)

MAX_LINES_PER_S = 20.0
_STEP_KEYS = ("step", "training_iteration", "iteration", "epoch")

Listener = Callable[[str, List[Dict[str, Any]], List[Dict[str, Any]]], None]


class ReportCollector:
    """Groups metric records by report until every rank has reported it.

    Listeners get ``(report_name, metrics_by_rank, records_by_rank)``.
    """

    def __init__(self, world_size: int) -> None:
        self.world_size = world_size
        self._pending: Dict[str, Dict[int, Dict[str, Any]]] = {}
        self.listeners: List[Listener] = []
        self.completed = 0

    def reset(self, world_size: int) -> None:
        """A new attempt (maybe at another size): drop partial reports."""
        self.world_size = world_size
        self._pending.clear()

    def on_records(self, records: Sequence[Dict[str, Any]]) -> None:
        for rec in records:
            key = rec.get("report") or f"seq{rec.get('seq')}"
            ranks = self._pending.setdefault(key, {})
            ranks[rec["rank"]] = rec
            if len(ranks) >= self.world_size:
                del self._pending[key]
                ordered = [ranks[r] for r in sorted(ranks)]
                self.completed += 1
                for listener in list(self.listeners):
                    try:
                        listener(key, [r["metrics"] for r in ordered], ordered)
                    except Exception:  # noqa: BLE001 - a listener never breaks training
                        logger.exception("report listener failed")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def _step_of(metrics: Dict[str, Any]) -> Optional[float]:
    for key in _STEP_KEYS:
        value = metrics.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
    return None


def summarize(metrics_by_rank: List[Dict[str, Any]], limit: int = 6) -> str:
    """``step=12 loss=0.25 (mean 0.26) acc=0.91``: rank 0's values; the mean over ranks where they differ."""
    first = metrics_by_rank[0] if metrics_by_rank else {}
    parts = []
    for key, value in list(first.items())[: limit + 1]:
        text = f"{key}={_fmt(value)}"
        values = [m.get(key) for m in metrics_by_rank]
        if (len(values) > 1 and key not in _STEP_KEYS
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
                and len(set(values)) > 1):
            text += f" (mean {_fmt(sum(values) / len(values))})"
        parts.append(text)
    return " ".join(parts)


class ProgressLine:
    """The progress display of one ``fit()``.

    Args:
        enabled: False shows nothing (``RunConfig(verbose=0)``).
        desc: the bar's label (the run's name).
    """

    def __init__(self, enabled: bool = True, desc: str = "train") -> None:
        self.enabled = enabled
        self.desc = desc
        self._bar: Any = None
        self._plain = False
        self._last_line = 0.0
        self._first: Optional[tuple] = None
        self._total: Optional[int] = None
        self.reports = 0
        self._skipped: Optional[str] = None
        if enabled:
            self._plain = not in_notebook() and not _isatty(sys.stderr)
            if not self._plain:
                from tqdm.auto import tqdm  # tqdm.auto: picks its widget or terminal bar when the bar is made

                self._bar = tqdm(desc=desc, unit="report", dynamic_ncols=True, leave=True, file=sys.stderr)

    def start_attempt(self) -> None:
        """Throughput is measured within one attempt (a restart resets it)."""
        self._first = None

    def rate(self, metrics: Dict[str, Any], now: float) -> str:
        key = next((k for k in _STEP_KEYS if _step_of({k: metrics.get(k)}) is not None), None)
        step = _step_of(metrics)
        if self._first is None:
            self._first = (now, step, self.reports)
            return ""
        t0, s0, r0 = self._first
        elapsed = now - t0
        if elapsed <= 0:
            return ""
        if step is not None and s0 is not None and step > s0:
            unit = {"step": "steps", "epoch": "epochs"}.get(key or "", "iterations")
            return f"{(step - s0) / elapsed:.{1 if (step - s0) / elapsed >= 10 else 2}f} {unit}/s"
        return f"{(self.reports - r0) / elapsed:.2f} reports/s"

    def on_report(self, name: str, metrics_by_rank: List[Dict[str, Any]], records: List[Dict[str, Any]]) -> None:
        if not self.enabled:
            return
        self.reports += 1
        now = time.time()
        when = records[0].get("time", now) if records else now  # when rank 0 reported, not when it arrived
        rate = self.rate(metrics_by_rank[0] if metrics_by_rank else {}, when)
        text = summarize(metrics_by_rank)
        tail = f"{len(metrics_by_rank)} worker{'s' if len(metrics_by_rank) != 1 else ''}" + (f", {rate}" if rate else "")
        total = next((r.get("total") for r in records if r.get("total")), None)
        if self._bar is not None:
            if total and total != self._total:
                self._total = self._bar.total = int(total)
            self._bar.set_postfix_str(f"{text} [{tail}]", refresh=False)
            self._bar.update(1)
            return
        line = f"({self.desc}) report {self.reports}: {text} [{tail}]\n"
        if now - self._last_line >= 1.0 / MAX_LINES_PER_S:
            self._last_line, self._skipped = now, None
            self.write(line)
        else:
            self._skipped = line

    def write(self, text: str, stream: Any = None) -> None:
        """Write text above the bar (worker output, notices)."""
        stream = stream or sys.stderr
        if self._bar is not None:
            from tqdm.auto import tqdm  # tqdm.auto: picks its widget or terminal bar when the bar is made

            tqdm.write(text.rstrip("\n"), file=stream)
        else:
            stream.write(text)
            stream.flush()

    def close(self) -> None:
        if self._skipped is not None:
            self.write(self._skipped)
            self._skipped = None
        if self._bar is not None:
            self._bar.close()
            self._bar = None


class TrainSink(OutputSink):
    """Worker output of a training run, every line prefixed with ``[rank N]``, written above the bar."""

    def __init__(self, progress: ProgressLine) -> None:
        self.progress = progress
        self._label = Labeller()

    def stream(self, rank: int, name: str, text: str, label: bool) -> None:
        target = sys.stderr if name == "stderr" else sys.stdout
        self.progress.write(self._label(rank, name, text), target)

    def display(self, rank: int, data: Dict[str, Any], metadata: Dict[str, Any], label: bool) -> None:
        text = data.get("text/plain", "")
        if text:
            self.stream(rank, "stdout", text.rstrip("\n") + "\n", True)

    def notice(self, text: str) -> None:
        self.progress.write(text.rstrip("\n") + "\n", sys.stderr)


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except Exception:  # noqa: BLE001
        return False


def in_notebook() -> bool:
    """Whether this runs in a Jupyter kernel (tqdm.auto then draws a widget bar)."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
    except Exception:  # noqa: BLE001
        return False
    return shell is not None and getattr(shell, "kernel", None) is not None
