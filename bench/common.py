"""Shared helpers of the benchmark suite: statistics, alternation, figures, PSS, the summary table.

Nothing here imports torch or Ray at module level, so the memory benchmark's
driver stays as light as a notebook kernel's.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
import statistics
import sys
import time
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Tuple

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


def median_ci(xs: Sequence[float], level: float = 0.95, resamples: int = 2000) -> Tuple[float, float]:
    """Bootstrap confidence interval of the median (fixed seed: the same data give the same interval)."""
    import random

    if len(xs) < 3:
        return (min(xs), max(xs)) if xs else (float("nan"), float("nan"))
    rng = random.Random(0)
    meds = sorted(statistics.median(rng.choices(xs, k=len(xs))) for _ in range(resamples))
    lo = meds[int((1 - level) / 2 * resamples)]
    hi = meds[min(resamples - 1, int((1 + level) / 2 * resamples))]
    return lo, hi


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
    """One figure compared with its target: ``value <op> target`` passes.

    ``op="info"`` marks a diagnostic: printed with the target for reference, never a verdict.
    """

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
        if self.value is None or self.op == "info":
            return None
        return self.value < self.target if self.op == "<" else self.value >= self.target

    @property
    def verdict(self) -> str:
        if self.op == "info" and self.value is not None:
            return "info"
        return {True: "PASS", False: "MISS", None: "ERROR"}[self.passed]

    def miss_by(self) -> str:
        """How far from the target, in the figure's unit and in per cent."""
        if self.passed is not False or self.value is None:
            return ""
        gap = self.value - self.target
        if self.unit == "%":
            return f"{gap:+.3g} percentage points"
        pct = 100.0 * gap / self.target if self.target else float("inf")
        return f"{gap:+.3g} {self.unit} ({pct:+.0f}%)"

    def as_dict(self) -> Dict[str, Any]:
        d = dataclasses.asdict(self)
        d["verdict"] = self.verdict
        return d


def fmt_value(v: Optional[float], unit: str) -> str:
    if v is None:
        return "n/a"
    if float(v).is_integer():
        return f"{v:.0f} {unit}".strip()
    if abs(v) >= 100:
        return f"{v:.0f} {unit}".strip()
    if abs(v) >= 10:
        return f"{v:.1f} {unit}".strip()
    return (f"{v:#.3g}".rstrip(".") + f" {unit}").strip()  # 1.00, 0.905, 2.34


def summary_table(figures: Iterable[Figure]) -> str:
    rows = [("#", "figure", "measured", "target", "verdict", "spread / note")]
    for f in figures:
        note = f.spread
        if f.note:
            note = f"{note}; {f.note}" if note else f.note
        if f.passed is False:
            note = f"missed by {f.miss_by()}; {note}"
        target = f"({fmt_value(f.target, f.unit)})" if f.op == "info" else f"{f.op} {fmt_value(f.target, f.unit)}"
        rows.append((f.key, f.label, fmt_value(f.value, f.unit), target,
                     f.verdict, note))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    lines = []
    for j, r in enumerate(rows):
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(5)) + "  " + r[5])
        if j == 0:
            lines.append("  ".join("-" * w for w in widths) + "  " + "-" * 13)
    return "\n".join(lines)


def loadavg() -> str:
    """The machine's 1/5/15-minute load averages (other work on a shared machine shows here)."""
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "?"


def section(title: str) -> None:
    print(f"\n=== {title} ===  [load average {loadavg()}, {os.cpu_count()} CPUs]", flush=True)


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


def pss_parts(pid: int) -> Dict[str, int]:
    """``Pss``, ``Pss_Anon`` (private heap: independent of who else maps the same libraries) and
    ``Pss_File`` of a process, in bytes; empty if it is gone."""
    out: Dict[str, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup") as fh:
            for line in fh:
                key = line.split(":", 1)[0]
                if key in ("Pss", "Pss_Anon", "Pss_File"):
                    out[key] = int(line.split()[1]) * 1024
    except (OSError, ValueError):
        return {}
    return out


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


# -- torchrun baselines (bench_transformers, bench_lightning) -------------------------------------------


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for torchrun's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(script: str, *args: str, nice: int = 0) -> List[str]:
    """``torchrun --nproc-per-node 2`` of ``script`` on 127.0.0.1 (at niceness ``nice`` when not 0)."""
    return ["nice", "-n", str(nice)] * bool(nice) + [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(free_port()), script, *args]


def torchrun_env() -> Dict[str, str]:
    """One torch thread per process, as every benchmark runs; torchrun's error file discarded."""
    return dict(os.environ, OMP_NUM_THREADS="1", TORCHELASTIC_ERROR_FILE=os.devnull)


def _last_error(log: Optional[str]) -> str:
    """The line of torchrun's log that says what went wrong (the first exception's, else the last line)."""
    if not log or not os.path.exists(log):
        return "no log"
    with open(log, errors="replace") as fh:
        lines = [ln.strip() for ln in fh if ln.strip()]
    # an exception's own line ("ValueError: ..."), the first one: torchrun's ChildFailedError only wraps it
    errors = [ln for ln in lines
              if re.match(r"^[\w.]+(Error|Exception|Interrupt)\b", ln) and "ChildFailedError" not in ln]
    return (errors or lines or ["an empty log"])[0 if errors else -1][:300]


def wait_json(paths: List[str], timeout: float, proc: Any, log: Optional[str] = None) -> List[Dict[str, float]]:
    """Wait until every file exists (polling, with a deadline and a check that ``proc`` still runs), then read them;
    if ``proc`` ends first, the error says why in one line, from its ``log``."""
    deadline = time.time() + timeout
    while not all(os.path.exists(p) for p in paths):
        if proc.poll() is not None:
            names = ", ".join(os.path.basename(p) for p in paths)
            raise RuntimeError(f"torchrun exited with {proc.returncode} before writing {names}: {_last_error(log)} "
                               f"(log: {log})")
        if time.time() > deadline:
            raise TimeoutError(f"torchrun wrote none of {paths} within {timeout:.0f} s")
        time.sleep(0.02)
    out = []
    for p in paths:
        with open(p) as fh:
            out.append(json.load(fh))
    return out


class TorchrunServer:
    """``torchrun --nproc-per-node 2`` of a server script (``source``), started once, running its workload on
    each command: it writes ``start-<rank>.json`` once ready, then ``res-<i>-<rank>.json`` per command."""

    def __init__(self, source: str, folder: str, steps: int, wait_s: float = 300.0, nice: int = 0) -> None:
        import subprocess

        self.folder, self.i = folder, 0
        os.makedirs(folder, exist_ok=True)
        script = os.path.join(folder, "server.py")
        with open(script, "w") as fh:
            fh.write(source)
        self.started = time.time()
        self.log = os.path.join(folder, "torchrun.log")  # why it ended, should it end early
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(torchrun_cmd(script, folder, str(steps), nice=nice), stdout=log,
                                         stderr=subprocess.STDOUT, env=torchrun_env())
        self.first = wait_json([os.path.join(folder, f"start-{r}.json") for r in range(2)], wait_s, self.proc,
                               self.log)

    def _command(self, word: str) -> None:
        with open(os.path.join(self.folder, f"cmd-{self.i}"), "w") as fh:
            fh.write(word)

    def step(self) -> Dict[str, float]:
        """Run the workload once on both ranks; the slower rank's steps per second."""
        self._command("go")
        out = wait_json([os.path.join(self.folder, f"res-{self.i}-{r}.json") for r in range(2)], 300.0, self.proc,
                        self.log)
        self.i += 1
        return {"steps_per_s": min(o["steps_per_s"] for o in out)}

    def close(self) -> None:
        import subprocess

        self._command("stop")
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=30)


def torchrun_fresh_start(source: str, folder: str) -> float:
    """Seconds from launching ``torchrun`` of ``source`` to its first finished step (new processes)."""
    server = TorchrunServer(source, folder, steps=5)
    try:
        return min(o["first_step"] for o in server.first) - server.started
    finally:
        server.close()


def timed_group_cell(group: Any, source: str) -> Dict[str, float]:
    """Run ``source`` on ``group`` (it binds ``_r`` with ``steps_per_s`` and ``first_step`` on every rank): the
    slower rank's steps per second and the seconds from the call to the first rank's first step."""
    from raytrain_nb._internal.output import CollectSink

    t0 = time.time()
    group.run(source, sink=CollectSink())
    results = group.pull("_r", rank=None)
    return {"steps_per_s": min(r["steps_per_s"] for r in results),
            "first_step": min(r["first_step"] for r in results) - t0}


def run_standalone(run: Callable[..., List["Figure"]], doc: str, name: str, quick_help: str) -> int:
    """A bench file run on its own (``python bench/bench_x.py [--quick]``): its figures, a summary table, and
    ``bench/results/<name>.json``; exits 1 if a figure missed its target."""
    import argparse

    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=quick_help)
    args = parser.parse_args()
    figures = run(quick=args.quick)
    section("summary")
    print(summary_table(figures))
    os.makedirs(RESULTS_DIR, exist_ok=True)
    path = os.path.join(RESULTS_DIR, f"{name}.json")
    with open(path, "w") as fh:
        json.dump({"quick": args.quick, "figures": [f.as_dict() for f in figures]}, fh, indent=1, default=str)
    print(f"results: {path}")
    return 0 if all(f.passed is not False for f in figures) else 1
