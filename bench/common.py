"""Shared helpers of the benchmark suite: statistics, alternation, figures, PSS, the summary table.

Nothing here imports torch or Ray at module level, so the memory benchmark's
driver stays as light as a notebook kernel's.
"""
from __future__ import annotations

import dataclasses
import os
import statistics
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
RESULTS_DIR = os.path.join(BENCH_DIR, "results")


def single_thread() -> None:
    """One intra-op thread in this process (set before torch is imported, and again after)."""
    os.environ["OMP_NUM_THREADS"] = "1"
    os.environ["MKL_NUM_THREADS"] = "1"
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.set_num_threads(1)


# -- statistics -----------------------------------------------------------------------------


def stats(xs: Sequence[float]) -> Dict[str, float]:
    """Median, quartiles, min and max of a sample."""
    xs = sorted(xs)
    if not xs:
        return {"n": 0}
    if len(xs) >= 4:
        q1, _, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    else:
        q1, q3 = xs[0], xs[-1]
    return {"n": len(xs), "median": statistics.median(xs), "q1": q1, "q3": q3, "min": xs[0], "max": xs[-1],
            "mean": statistics.fmean(xs)}


def fmt_stats(s: Dict[str, float], scale: float = 1.0, unit: str = "", digits: int = 2) -> str:
    """``median (IQR q1-q3, min-max) unit``, everything multiplied by ``scale``."""
    if not s.get("n"):
        return "n/a"
    f = lambda v: f"{v * scale:.{digits}f}"  # noqa: E731
    return (f"{f(s['median'])} {unit} (IQR {f(s['q1'])}-{f(s['q3'])}, "
            f"min-max {f(s['min'])}-{f(s['max'])}, n={s['n']})")


def alternate(variants: Dict[str, Callable[[], Any]], rounds: int, warmup: int = 1,
              between: Optional[Callable[[], None]] = None) -> Dict[str, List[Any]]:
    """Run the variants interleaved (A B C A B C ...) ``rounds`` times after ``warmup`` rounds.

    Each callable returns its own measurement (a number or a dict); warm-up rounds are dropped.
    """
    out: Dict[str, List[Any]] = {name: [] for name in variants}
    for i in range(warmup + rounds):
        for name, fn in variants.items():
            value = fn()
            if i >= warmup:
                out[name].append(value)
            if between is not None:
                between()
    return out


def timed(fn: Callable[[], Any]) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


# -- figures and the summary table -------------------------------------------------------


@dataclasses.dataclass
class Figure:
    """One figure compared with its target: ``value <op> target`` passes."""

    key: str
    label: str
    value: Optional[float]
    unit: str
    op: str  # "<" or ">="
    target: float
    spread: str = ""
    note: str = ""
    detail: Dict[str, Any] = dataclasses.field(default_factory=dict)

    @property
    def passed(self) -> Optional[bool]:
        if self.value is None:
            return None
        return self.value < self.target if self.op == "<" else self.value >= self.target

    @property
    def verdict(self) -> str:
        return {True: "PASS", False: "MISS", None: "ERROR"}[self.passed]

    def miss_by(self) -> str:
        """How far from the target, in the figure's unit and in per cent."""
        if self.passed is not False or self.value is None:
            return ""
        gap = self.value - self.target
        pct = 100.0 * gap / self.target if self.target else float("inf")
        return f"{gap:+.3g} {self.unit} ({pct:+.0f}%)"

    def as_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["verdict"] = self.verdict
        return d


def fmt_value(v: Optional[float], unit: str) -> str:
    if v is None:
        return "n/a"
    if abs(v) >= 100:
        return f"{v:.0f} {unit}".strip()
    if abs(v) >= 10:
        return f"{v:.1f} {unit}".strip()
    return f"{v:.3g} {unit}".strip()


def summary_table(figures: Iterable[Figure]) -> str:
    rows = [("#", "figure", "measured", "target", "verdict", "spread / note")]
    for f in figures:
        note = f.spread
        if f.note:
            note = f"{note}; {f.note}" if note else f.note
        if f.passed is False:
            note = f"missed by {f.miss_by()}; {note}"
        rows.append((f.key, f.label, fmt_value(f.value, f.unit), f"{f.op} {fmt_value(f.target, f.unit)}",
                     f.verdict, note))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5])
        if j == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 13)
    return "\n".join(lines)


def section(title: str) -> None:
    print(f"\n=== {title} ===", flush=True)


# -- memory ---------------------------------------------------------------------------------


def pss_bytes(pid: int) -> Optional[int]:
    """Proportional set size of a process, from ``/proc/PID/smaps_rollup`` (None if it is gone)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return None
    return None


def ray_session_pids(driver_pid: int, session_dir: str) -> Dict[int, str]:
    """Every process of the Ray instance this driver started: its descendants, plus any process
    whose command line names the session directory (pid -> short name)."""
    import psutil

    found: Dict[int, str] = {}
    try:
        for child in psutil.Process(driver_pid).children(recursive=True):
            try:
                found[child.pid] = _short_name(child)
            except psutil.Error:
                continue
    except psutil.Error:
        pass
    tag = os.path.basename(session_dir.rstrip("/"))
    for proc in psutil.process_iter(["pid", "cmdline"]):
        try:
            if proc.pid != driver_pid and tag and any(tag in part for part in (proc.info["cmdline"] or [])):
                found.setdefault(proc.pid, _short_name(proc))
        except psutil.Error:
            continue
    return found


def _short_name(proc: Any) -> str:
    cmd = proc.cmdline()
    name = proc.name()
    if name.startswith("ray::") or not cmd:
        return name
    for part in cmd[:3]:
        if part.endswith(".py"):
            return os.path.basename(part)
    return os.path.basename(cmd[0])
