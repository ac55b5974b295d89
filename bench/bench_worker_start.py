"""Section 17: how long a group takes to start in fresh worker processes, through the embedded instance's
lean entry (``lean_entry.py``) and through Ray's own ``default_worker.py``, in this environment.

With JupyterLab installed beside Ray (as here and on Binder), ``jsonschema`` builds the ``rfc3987_syntax`` IRI
grammar in every process that imports Ray; the lean entry defers it (for the workers and Ray's Python head
processes). Each variant runs in a process of its own (the worker script is fixed when Ray starts): Ray started once, then ``STARTS`` groups of 2 one after another,
each started, run one cell, shut down, so every group after the first gets new processes. Variants alternate
(lean, Ray's, lean, ...) for ``rounds`` rounds; the figure is the median of the per-round ratios of the median
start time, with its 95 % interval.

Usage: ``.venv/bin/python bench/bench_worker_start.py [--rounds 3]``; ``run_all.py --only 17`` calls :func:`run`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from typing import Any, Dict, List

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import REPO_DIR, Figure, alternate, fmt_stats, median_ci, section, stats  # noqa: E402

STARTS = 4  # groups per process; the first may take Ray's prestarted workers, so it is left out

CHILD = """
import json, os, sys, time
os.environ["OMP_NUM_THREADS"] = "1"
if sys.argv[1] == "ray":
    os.environ["RAYTRAIN_NB_LEAN_ENTRY"] = "0"
from raytrain_nb._internal import cluster
from raytrain_nb import WorkerGroup
from raytrain_nb._internal.output import CollectSink
t = time.perf_counter(); cluster.connect(); connect = time.perf_counter() - t
starts = []
for _ in range(int(sys.argv[2])):
    t = time.perf_counter()
    g = WorkerGroup(2)
    g.run("import torch; ready = True", sink=CollectSink())
    starts.append(time.perf_counter() - t)
    g.shutdown()
print("RESULT " + json.dumps({"connect_s": connect, "starts_s": starts}))
"""


def _child(variant: str) -> Dict[str, Any]:
    env = {**os.environ, "RAYTRAIN_NB_NUM_CPUS": "4"}
    proc = subprocess.run([sys.executable, "-c", CHILD, variant, str(STARTS)], capture_output=True, text=True,
                          timeout=300, cwd=REPO_DIR, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{variant}: exit {proc.returncode}\n{proc.stderr[-3000:]}")
    out = json.loads(lines[-1][len("RESULT "):])
    out["median_start_s"] = statistics.median(out["starts_s"][1:])
    return out


def run(rounds: int = 3, quick: bool = False) -> List[Figure]:
    section("17. Ray's start and a group of 2 in fresh processes: through lean_entry.py vs as Ray starts them (own processes)")
    rounds = 1 if quick else rounds
    samples = alternate({"lean": lambda: _child("lean"), "ray": lambda: _child("ray")}, rounds=rounds, warmup=0)
    ratios = [a["median_start_s"] / b["median_start_s"] for a, b in zip(samples["lean"], samples["ray"])]
    lean = stats([s["median_start_s"] for s in samples["lean"]])
    ray = stats([s["median_start_s"] for s in samples["ray"]])
    r = stats(ratios)
    lo, hi = median_ci(ratios) if len(ratios) > 1 else (ratios[0], ratios[0])
    print(f"  group start, lean entry: {fmt_stats(lean, unit='s')}")
    print(f"  group start, as Ray starts it: {fmt_stats(ray, unit='s')}")
    print(f"  ratio lean/Ray's: {fmt_stats(r, digits=3)}; 95% CI {lo:.3f}-{hi:.3f}")
    connect = {k: statistics.median(s["connect_s"] for s in v) for k, v in samples.items()}
    connect_ratios = [a["connect_s"] / b["connect_s"] for a, b in zip(samples["lean"], samples["ray"])]
    c = stats(connect_ratios)
    print(f"  Ray's start (cluster.connect) ratio lean/Ray's: {fmt_stats(c, digits=3)}")
    return [
        Figure("17a", "group of 2 in new processes: lean entry / Ray's own (median ratio)", r["median"], "x", "<", 0.9,
               spread=f"95% CI {lo:.3f}-{hi:.3f}, n={r['n']}",
               note=f"medians {lean['median']:.2f} s vs {ray['median']:.2f} s", detail={"samples": samples, "ratios": ratios}),
        Figure("17b", "Ray's start (cluster.connect): lean entry / Ray's own (median ratio)", c["median"], "x", "<", 0.9,
               spread=f"n={c['n']}", note=f"medians {connect['lean']:.1f} s vs {connect['ray']:.1f} s",
               detail={"ratios": connect_ratios}),
    ]


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    for figure in run(rounds=args.rounds):
        print(figure)
