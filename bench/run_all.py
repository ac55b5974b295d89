"""Run the benchmark suite (``make bench``): print each figure with its spread, then a summary
table of figure vs target, and write everything to ``bench/results/core.json``.

Not part of the tests. One Ray instance (started with the project's own ``cluster.connect()``)
and one 2-worker gloo group serve figures 1-4 and 6; figure 5 runs in a fresh process of its own.
Every process runs torch with one thread. Takes about 3 minutes on a 2-core machine.

Options: ``--only 1,3,5`` runs a subset (figure numbers); ``--quick`` runs fewer repetitions.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
import traceback
from typing import Any, Callable, List

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import REPO_DIR, RESULTS_DIR, Figure, loadavg, section, single_thread, summary_table  # noqa: E402


def _memory_figures(quick: bool) -> List[Figure]:
    section("5. memory (PSS) of a fresh session with 2 idle workers; worker vs bare Ray actor (own process)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAYTRAIN_NB_")}
    env["OMP_NUM_THREADS"] = "1"
    out = os.path.join(RESULTS_DIR, ".memory.json")
    if os.path.exists(out):
        os.remove(out)
    proc = subprocess.run([sys.executable, os.path.join(BENCH_DIR, "bench_memory.py"), out], env=env,
                          cwd=REPO_DIR, timeout=300)
    if proc.returncode != 0 or not os.path.exists(out):
        raise RuntimeError(f"bench_memory.py failed (exit {proc.returncode})")
    with open(out) as fh:
        m = json.load(fh)
    os.remove(out)
    worst = max(m["worker_over_bare"], key=abs)
    worst_ddp = max(m["worker_over_bare_ddp"], key=abs)
    top = sorted(m["by_name"].items(), key=lambda kv: -kv[1]["pss_mb"])[:4]
    return [
        Figure("5a", "PSS: driver + Ray + 2 idle torch workers", m["total_pss_mb"] / 1024, "GB", "<", 1.5,
               spread=f"{m['processes']} processes",
               note="largest: " + ", ".join(f"{n} {v['pss_mb']:.0f} MB" for n, v in top)
               + f"; after a DDP step {m['total_after_step_pss_mb'] / 1024:.2f} GB", detail=m),
        Figure("5b", "worker PSS after DDP step vs bare actor", 100 * abs(worst), "%", "<", 15.0,
               spread="workers " + "/".join(f"{w:.0f}" for w in m["worker_pss_mb"]) + f" MB, bare {m['bare_pss_mb']:.0f} MB",
               note="signed: " + ", ".join(f"{100 * d:+.1f}%" for d in m["worker_over_bare"])),
        Figure("5b'", "diagnostic: worker vs bare actor after same DDP step", 100 * abs(worst_ddp), "%", "info", 15.0,
               spread=f"bare actor after a plain torch DDP step {m['bare_ddp_pss_mb']:.0f} MB",
               note="signed: " + ", ".join(f"{100 * d:+.1f}%" for d in m["worker_over_bare_ddp"])),
        Figure("5c", "helper actors alive besides the workers", float(len(m["helper_actors"])), "", "<", 1,
               note=", ".join(str(a.get("class")) for a in m["helper_actors"]) or "none"),
    ]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default="", help="comma-separated section numbers (1-24)")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    args = parser.parse_args()
    only = {int(x) for x in args.only.split(",") if x.strip()} or set(range(1, 25))

    started = time.time()
    load_start = loadavg()
    t0 = time.perf_counter()
    os.makedirs(RESULTS_DIR, exist_ok=True)
    os.chdir(REPO_DIR)
    single_thread()
    os.environ.setdefault("RAYTRAIN_NB_NUM_CPUS", "4")
    os.environ.setdefault("RAYTRAIN_NB_OBJECT_STORE_BYTES", str(200 * 1024 * 1024))
    # Ray's workers import what a section ships by reference (its functions and actor classes live in bench
    # modules, not __main__ as when a section runs alone): each Ray started from here gives them this folder too.
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (BENCH_DIR, os.environ.get("PYTHONPATH", "")) if p)

    figures: List[Figure] = []
    errors: List[str] = []

    def attempt(what: str, fn: Callable[[], List[Figure]]) -> None:
        try:
            figures.extend(fn())
        except Exception:  # noqa: BLE001 - one broken benchmark must not hide the others
            tb = traceback.format_exc()
            print(f"  ERROR in {what}:\n{tb}", flush=True)
            errors.append(f"{what}: {tb.strip().splitlines()[-1]}")

    if 5 in only:  # first, while the machine is quiet and before this process grows
        attempt("memory", lambda: _memory_figures(args.quick))

    group: Any = None
    if only & {1, 2, 3, 4, 6}:
        import torch

        torch.set_num_threads(1)
        import bench_interrupt
        import bench_latency
        import bench_throughput
        from raytrain_nb import WorkerGroup
        from raytrain_nb._internal import cluster
        from raytrain_nb._internal.output import CollectSink
        from workload import GROUP_SETUP

        section("setup: Ray (raytrain_nb cluster.connect) and a 2-worker gloo group")
        t = time.perf_counter()
        cluster.connect()
        t_ray = time.perf_counter() - t
        t = time.perf_counter()
        group = WorkerGroup(2)
        t_group = time.perf_counter() - t
        group.run(GROUP_SETUP, sink=CollectSink())
        print(f"  ray up in {t_ray:.1f} s, group of 2 in {t_group:.1f} s; torch threads=1 everywhere")
        calls = 100 if args.quick else bench_latency.CALLS
        try:
            if 1 in only:
                attempt("latency", lambda: bench_latency.run_latency(group, calls))
            if 2 in only:
                attempt("magic", lambda: bench_latency.run_magic(group, calls))
            if only & {3, 4}:
                attempt("throughput", lambda: [f for f in bench_throughput.run(
                    group, steps=200 if args.quick else bench_throughput.STEPS,
                    rounds=2 if args.quick else bench_throughput.ROUNDS) if int(f.key[0]) in only])
            if 6 in only:
                attempt("interrupt", lambda: bench_interrupt.run(group, repeats=2 if args.quick else
                                                                 bench_interrupt.REPEATS))
        finally:
            group.shutdown()
            import ray

            ray.shutdown()

    # Sections with a run() of their own (each starts what it needs): 7 checkpoints, 8 recovery,
    # 9 dashboard, 10 trainer, ..., 18 a no-op cell in a real kernel with the dashboard shown, 19 looking inside,
    # 20 experiment tracking with its server down, 21 scale, 22 reported checkpoints uploaded, 23 taking over a
    # keep-alive group from a new process, 24 a sharded (FSDP2) model.
    for number, module, kwargs in ((7, "bench_checkpoint", {"rounds": 3 if args.quick else 7}),
                                   (8, "bench_recovery", {"rounds": 1 if args.quick else 3}),
                                   (9, "bench_dashboard", {"quick": args.quick}), (10, "bench_trainer", {"quick": args.quick}),
                                   (11, "bench_tune", {"quick": args.quick}),
                                   (12, "bench_tune_warm", {"quick": args.quick}),
                                   (13, "bench_tune_widget", {"quick": args.quick}),
                                   (14, "bench_transformers", {"quick": args.quick}),
                                   (15, "bench_lightning", {"quick": args.quick}),
                                   (16, "bench_xgboost", {"quick": args.quick}),
                                   (17, "bench_worker_start", {"quick": args.quick}),
                                   (18, "bench_kernel", {"quick": args.quick}),
                                   (19, "bench_inspect", {"quick": args.quick}),
                                   (20, "bench_tracking", {"quick": args.quick}),
                                   (21, "bench_scale", {"quick": args.quick}),
                                   (22, "bench_report_upload", {"quick": args.quick}),
                                   (23, "bench_attach", {"quick": args.quick}),
                                   (24, "bench_sharded", {"quick": args.quick})):
        if number in only and os.path.exists(os.path.join(BENCH_DIR, module + ".py")):
            attempt(module, lambda m=module, kw=kwargs: __import__(m).run(**kw))

    wall = time.perf_counter() - t0
    section(f"summary ({wall:.0f} s)")
    # numbered sections in numeric order (2 before 10), then the lettered ones (c: checkpoints, r: recovery)
    figures.sort(key=lambda f: (int(re.match(r"\d*", f.key).group() or 99), f.key))
    print(summary_table(figures))
    for e in errors:
        print(f"ERROR  {e}")
    missed = [f.key for f in figures if f.passed is False]
    failed = len(errors) + sum(f.verdict == "ERROR" for f in figures)  # whole sections, and figures that could not run
    print(f"\n{sum(f.passed is True for f in figures)} PASS, {len(missed)} MISS"
          + (f" ({', '.join(missed)})" if missed else "") + f", {failed} ERROR; "
          f"{sum(f.op == 'info' for f in figures)} diagnostics (info: no target of their own)")
    print(f"load average at start {load_start}, at end {loadavg()} on {os.cpu_count()} CPUs "
          "(above ~2, other work shares this machine and throughput figures get noisy)")

    result = {
        "started": time.strftime("%Y-%m-%dT%H:%M:%S", time.localtime(started)),
        "wall_s": wall,
        "quick": args.quick,
        "load_average": {"start": load_start, "end": loadavg()},
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "versions": _versions(),
        "figures": [f.as_dict() for f in figures],
        "errors": errors,
    }
    path = os.path.join(RESULTS_DIR, "core.json")
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    print(f"results: {os.path.relpath(path, REPO_DIR)}")
    return 1 if errors else 0


def _versions() -> dict:
    out = {}
    for mod in ("ray", "torch", "IPython", "raytrain_nb"):
        try:
            out[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001
            out[mod] = None
    return out


if __name__ == "__main__":
    sys.exit(main())
