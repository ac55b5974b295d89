"""Section 23: how long a new kernel takes to take over a warm keep-alive group of 2 (``%dist_attach``).

One process starts ``WorkerGroup(2, keep_alive=...)`` on the shared instance (started for the bench, in a record
folder of its own), builds a small model and ends without shutting anything down (as a killed kernel does). Then,
``rounds`` times, a fresh process connects and attaches the group (``WorkerGroup.attach``: Ray's connection, the
custodian's claim, the run storage, every worker pinged), runs one cell on it and detaches; the figure is the median
of the attach times, Ray's import excluded (a kernel has it loaded by then or pays it once either way) and Ray's
connection included. The group is shut down at the end, and the supervisor then stops the instance.

Usage: ``.venv/bin/python bench/bench_attach.py [--quick]``; ``run_all.py --only 23`` calls :func:`run`.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Dict, List

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import REPO_DIR, Figure, fmt_stats, loadavg, run_standalone, section, stats  # noqa: E402

START = """
import os, time
from raytrain_nb import WorkerGroup
from raytrain_nb._internal.output import CollectSink
g = WorkerGroup(2, keep_alive=300, name="bench-attach")
g.run("import torch; model = torch.nn.Linear(64, 64); opt = torch.optim.Adam(model.parameters())", sink=CollectSink())
g.detach(300)
print("RESULT {}")
"""

ATTACH = """
import json, sys, time
import ray  # imported first: its import is not the attach's
from raytrain_nb import WorkerGroup
from raytrain_nb._internal.output import CollectSink
t = time.perf_counter()
g = WorkerGroup.attach("bench-attach")
attach = time.perf_counter() - t
t = time.perf_counter()
g.run("x = sum(p.sum().item() for p in model.parameters())", sink=CollectSink())
cell = time.perf_counter() - t
if sys.argv[1] == "last":
    g.shutdown()
else:
    g.detach(300)
print("RESULT " + json.dumps({"attach_s": attach, "first_cell_s": cell}))
"""


def _child(code: str, env: Dict[str, str], *args: str) -> Dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=600,
                          cwd=REPO_DIR, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"exit {proc.returncode}\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def run(rounds: int = 5, quick: bool = False) -> List[Figure]:
    section("23. Taking over a warm keep-alive group of 2 from a new process (%dist_attach)")
    rounds = 2 if quick else rounds
    folder = tempfile.mkdtemp(prefix="rtnb-bench-attach-")
    env = {**os.environ, "RAYTRAIN_NB_INSTANCE_DIR": os.path.join(folder, "instance"),
           "RAYTRAIN_NB_STORAGE_PATH": os.path.join(folder, "runs"), "RAYTRAIN_NB_NUM_CPUS": "4",
           "OMP_NUM_THREADS": "1"}
    env.pop("RAY_ADDRESS", None)
    _child(START, env)
    samples = [_child(ATTACH, env, "last" if i == rounds - 1 else "more") for i in range(rounds)]
    attach = stats([s["attach_s"] for s in samples])
    cell = stats([s["first_cell_s"] for s in samples])
    load = loadavg()
    print(f"  attach (connect, claim, run storage, ping): {fmt_stats(attach, unit='s')}  [load {load}]")
    print(f"  first cell after the attach: {fmt_stats(cell, unit='s')}")
    return [
        Figure("23a", "attach a warm 2-worker group from a new process (median)", attach["median"], "s", "<", 5.0,
               spread=f"n={attach['n']}", note=f"load average {load}", detail={"samples": samples}),
        Figure("23b", "first cell after the attach (median)", cell["median"], "s", "info", 0.0,
               spread=f"n={cell['n']}"),
    ]


if __name__ == "__main__":
    sys.exit(run_standalone(run, __doc__, "bench_attach", "2 attaches instead of 5"))
