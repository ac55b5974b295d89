"""`make test`'s time against its budget, with what the machine was like meanwhile (CI's own step, stdlib only).

The same suite has taken twice as long on one 2-core machine as on another (slower cores, or cores shared with other
machines: "steal" in /proc/stat). What the machine was like meanwhile tells a slow machine from a slower suite: the
CPU the run used (core-seconds: 1257 for pytest on the machine where make test took 862 s, 1702 on one where it took
about 1310 s, 2824 on one where it took about 33 minutes), the share stolen, a single-core reference loop timed before
the suite, and the CPU of a fresh ``import torch, ray`` timed after it (what every rank process pays first; the loop
alone tracked the suite poorly: 1.6-2.3 s on the 1310 s machine, 0.90-0.98 s on the 862 s one).

    python3 .ci/machine.py start FILE            # before `make test`
    python3 .ci/machine.py end FILE --budget S   # after it: one line, also written next to FILE as .txt
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import time
from pathlib import Path
from typing import Dict

#: Iterations of the reference loop: about 1 s (0.96 s) on the 2-core machine where make test took 862 s.
REFERENCE_N = 20_000_000


def _cpu() -> Dict[str, int]:
    """The machine's CPU time in clock ticks: busy (user, nice, system, irq, softirq), idle (with iowait), stolen."""
    fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return {"busy": user + nice + system + irq + softirq, "idle": idle + iowait, "steal": steal}


def _reference_s() -> float:
    """Seconds of one core for a fixed pure-Python loop."""
    start = time.perf_counter()
    sum(i * i for i in range(REFERENCE_N))
    return time.perf_counter() - start


#: The suite's own interpreter, made by `make test`; absent when the set-up failed.
VENV_PYTHON = Path(".venv/bin/python")


def _import_cpu_s(repeats: int = 3) -> float:
    """Median CPU seconds of a fresh ``import torch, ray`` in the suite's venv; NaN without one."""
    if not VENV_PYTHON.exists():
        return float("nan")
    spent = []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        try:
            subprocess.run([str(VENV_PYTHON), "-c", "import torch, ray"], capture_output=True, timeout=120, check=False)
        except (OSError, subprocess.SubprocessError):
            return float("nan")  # a figure to print, never a reason for CI to fail
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        spent.append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return statistics.median(spent)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=("start", "end"))
    parser.add_argument("file", type=Path)
    parser.add_argument("--budget", type=float, default=1500.0, help="seconds (default: 25 minutes)")
    args = parser.parse_args()
    if args.what == "start":
        reference = _reference_s()
        args.file.write_text(json.dumps({"time": time.time(), "cpu": _cpu(), "reference_s": reference}))
        return 0
    start = json.loads(args.file.read_text())
    took = time.time() - start["time"]
    now = _cpu()
    spent = {k: now[k] - start["cpu"][k] for k in now}
    total = sum(spent.values()) or 1
    ticks = os.sysconf("SC_CLK_TCK")
    line = (f"CI: make test took {took:.0f} s of its {args.budget:.0f} s budget "
            f"({'within' if took <= args.budget else 'OVER'}); CPU meanwhile {spent['busy'] / ticks:.0f} core-s, "
            f"{100 * spent['busy'] / total:.0f} % busy, {100 * spent['steal'] / total:.1f} % stolen; "
            f"single-core reference loop {start['reference_s']:.2f} s; a fresh import of torch and ray "
            f"{_import_cpu_s():.1f} core-s")
    print(line)
    args.file.with_suffix(".txt").write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
