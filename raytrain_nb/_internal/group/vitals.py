"""What each rank uses and how fast it steps, as the driver last heard: resources, step time, the slow ranks.

Resources come with the polls of a running cell (the worker samples them at most once a second) and with
``status()``'s ping. A rank's step time is the time between its last two ``report()`` calls in a cell; a rank
whose step time is above ``SLOW_FACTOR`` times the median of its peers' for ``SLOW_REPORTS`` reports in a row
is slow, until a report of it is not. (Ranks that synchronise every step, as DDP does, step at the pace of the
slowest: there the slow rank shows in ``%dist_where``, the others waiting for it in a collective.)
"""
from __future__ import annotations

import bisect
import collections
import statistics
import threading
from typing import Any, Deque, Dict, Iterable, List, Optional, Set

#: A rank slower than this many times its peers' median step time ...
SLOW_FACTOR = 1.5
#: ... for this many reports in a row is marked slow.
SLOW_REPORTS = 3


class Vitals:
    """Resources, step times and slow ranks of one group (thread-safe: the poll and the observers write)."""

    def __init__(self, slow_factor: float = SLOW_FACTOR, slow_reports: int = SLOW_REPORTS) -> None:
        self.slow_factor = slow_factor
        self.slow_reports = slow_reports
        self._lock = threading.Lock()
        self.resources: Dict[int, Dict[str, Any]] = {}
        self.step_time: Dict[int, float] = {}
        self.slow: Set[int] = set()
        self._last_report: Dict[int, float] = {}
        self._recent: Dict[int, Deque[float]] = {}  # each rank's last ``slow_reports`` step times in this cell
        self._changed = False

    def take(self, rank: int, sample: Optional[Dict[str, Any]]) -> None:
        """A rank's resource sample (a poll or a ping brought it); a sample seen before changes nothing."""
        if not sample:
            return
        with self._lock:
            if self.resources.get(rank, {}).get("time") != sample.get("time"):
                self.resources[rank] = dict(sample)
                self._changed = True

    def changed(self) -> bool:
        """Whether anything changed since the last call (the caller tells the observers once)."""
        with self._lock:
            changed, self._changed = self._changed, False
            return changed

    def new_cell(self) -> None:
        """A cell starts: step times are measured from its first report on (the time between cells is no step),
        and the ranks are judged again on this cell's steps."""
        with self._lock:
            self._last_report.clear()
            self._recent.clear()
            self._changed |= bool(self.slow)
            self.slow.clear()

    def on_reports(self, records: Iterable[Dict[str, Any]]) -> bool:
        """Take ``report()`` records (``rank``, ``time``); returns whether the set of slow ranks changed."""
        with self._lock:
            before = set(self.slow)
            for rec in records:
                rank, t = rec.get("rank"), rec.get("time")
                if not isinstance(rank, int) or not isinstance(t, (int, float)):
                    continue
                last = self._last_report.get(rank)
                self._last_report[rank] = float(t)
                if last is None or t <= last:
                    continue
                self.step_time[rank] = float(t) - last
                self._recent.setdefault(rank, collections.deque(maxlen=self.slow_reports)).append(self.step_time[rank])
            self._judge()
            if self.slow != before:
                self._changed = True
            return self.slow != before

    def _judge(self) -> None:
        """Every rank against its peers, whatever order their reports came in: slow when each of its last
        ``slow_reports`` step times is above ``slow_factor`` times the median of its peers' typical step time."""
        typical = {r: statistics.median(times) for r, times in self._recent.items() if times}
        ordered = sorted(typical.values())  # each rank's peers' median from it: O(N log N) a round, not O(N^2)
        for rank, times in self._recent.items():
            if len(ordered) < 2 or len(times) < self.slow_reports:
                continue
            median = _median_without(ordered, typical[rank])
            if median > 0 and all(t > self.slow_factor * median for t in times):
                self.slow.add(rank)
            else:
                self.slow.discard(rank)

    def forget(self, ranks: Iterable[int]) -> None:
        """Ranks replaced or gone: their figures go with them."""
        with self._lock:
            for rank in ranks:
                for table in (self.resources, self.step_time, self._last_report, self._recent):
                    table.pop(rank, None)
                self.slow.discard(rank)

    def of(self, rank: int) -> Dict[str, Any]:
        """``{"resources", "step_time", "slow"}`` of ``rank`` (copies)."""
        with self._lock:
            return {"resources": dict(self.resources.get(rank, {})), "step_time": self.step_time.get(rank),
                    "slow": rank in self.slow}

    def slow_ranks(self) -> List[int]:
        with self._lock:
            return sorted(self.slow)


def _median_without(ordered: List[float], value: float) -> float:
    """The median of sorted ``ordered`` without one occurrence of ``value`` (which it holds)."""
    gone = bisect.bisect_left(ordered, value)
    n = len(ordered) - 1

    def at(k: int) -> float:  # the k-th of what is left
        return ordered[k] if k < gone else ordered[k + 1]
    return (at((n - 1) // 2) + at(n // 2)) / 2


def size(n: Optional[float]) -> str:
    """``812 MB``, ``1.2 GB``: a byte count as users read it."""
    if n is None:
        return "-"
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit in ("B", "KB", "MB") else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


def resources_text(res: Dict[str, Any]) -> str:
    """``cpu 98% · rss 1.2 GB · gpu 87% 10.1 GB`` with ``MEM!`` when near the memory limit; empty when unknown."""
    if not res:
        return ""
    parts = [f"cpu {res.get('cpu', 0):.0f}%", f"rss {size(res.get('rss'))}"]
    if res.get("gpu_mem") is not None:
        util = res.get("gpu_util")
        parts.append(("gpu " + (f"{util:.0f}% " if util is not None else "")) + size(res.get("gpu_mem")))
    if res.get("mem_flag"):
        limit = "container" if res.get("mem_limit_kind") == "cgroup" else "node's OOM threshold"
        parts.append(f"MEM! {size(res.get('mem_used'))} of {size(res.get('mem_limit'))} ({limit})")
    return " · ".join(parts)


def step_text(step_time: Optional[float], slow: bool) -> str:
    """``0.31 s/step`` and ``SLOW`` for a slow rank."""
    if step_time is None:
        return "SLOW" if slow else ""
    text = f"{step_time:.3g} s/step"
    return f"{text} SLOW" if slow else text
