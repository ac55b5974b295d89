"""`make test`'s time against its budget, with what the machine was like meanwhile (CI's own step, stdlib only).

The same suite has taken twice as long on one 2-core machine as on another (slower cores, or cores shared with other
machines: "steal" in /proc/stat). A single-core reference loop, timed before the suite, and the share of CPU time
stolen during it tell a slow machine from a slower suite.

    python3 .ci/machine.py start FILE            # before `make test`
    python3 .ci/machine.py end FILE --budget S   # after it: one line, also written next to FILE as .txt
"""
from __future__ import annotations

import argparse
import json
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
    line = (f"CI: make test took {took:.0f} s of its {args.budget:.0f} s budget "
            f"({'within' if took <= args.budget else 'OVER'}); CPU meanwhile {100 * spent['busy'] / total:.0f} % busy, "
            f"{100 * spent['steal'] / total:.1f} % stolen; single-core reference loop {start['reference_s']:.2f} s")
    print(line)
    args.file.with_suffix(".txt").write_text(line + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
