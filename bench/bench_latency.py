"""Figures 1 and 2: latency of a trivial cell, through ``WorkerGroup.run`` and through ``%%distributed``.

1. ``group.run("x += 1")`` on 2 workers, interleaved call by call with a no-op round trip to two
   plain Ray actors in parallel (the floor Ray itself sets) and with a no-op method (``ping``) called on
   the group's own ``Worker`` actors (the floor of those actors: figure 1r is run / that floor, call by
   call); ``x`` is pulled from both ranks at the end and must equal the number of runs.
2. ``shell.run_cell("%%distributed\\npass")`` in a real IPython ``InteractiveShell``, interleaved with
   ``shell.run_cell("pass")`` (IPython's own cost) and ``group.run("pass")`` (the group's cost).
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Any, List

from common import Figure, fmt_stats, median_ci, section, stats

CALLS = 300
WARMUP = 30


def _spread(s: dict, scale: float = 1e3) -> str:
    return (f"IQR {s['q1'] * scale:.2f}-{s['q3'] * scale:.2f}, "
            f"min-max {s['min'] * scale:.2f}-{s['max'] * scale:.2f}, n={s['n']}")


def run_latency(group: Any, calls: int = CALLS) -> List[Figure]:
    import ray

    from raytrain_nb._internal.output import CollectSink

    section(f"1. WorkerGroup.run('x += 1') on {group.num_workers} workers vs no-op Ray round trip (interleaved)")

    @ray.remote(num_cpus=0)
    class Noop:
        def noop(self) -> None:
            return None

    actors = [Noop.remote() for _ in range(group.num_workers)]
    ray.get([a.noop.remote() for a in actors])
    group.run("x = 0", sink=CollectSink())
    workers = [s.actor for s in group.slots]
    runs = 0
    t_run: List[float] = []
    t_ray: List[float] = []
    t_worker: List[float] = []
    for i in range(WARMUP + calls):
        t0 = time.perf_counter()
        group.run("x += 1", sink=CollectSink())
        t1 = time.perf_counter()
        runs += 1
        ray.get([a.noop.remote() for a in actors], timeout=60)
        t2 = time.perf_counter()
        ray.get([w.ping.remote() for w in workers], timeout=60)
        t3 = time.perf_counter()
        if i >= WARMUP:
            t_run.append(t1 - t0)
            t_ray.append(t2 - t1)
            t_worker.append(t3 - t2)
    xs = group.pull("x", rank=None)
    assert xs == [runs] * group.num_workers, f"x on each rank: {xs}, expected {runs}"
    for a in actors:
        ray.kill(a)
    s_run, s_ray, s_worker = stats(t_run), stats(t_ray), stats(t_worker)
    ratios = [r / w for r, w in zip(t_run, t_worker)]
    s_ratio, ci = stats(ratios), median_ci(ratios)
    print(f"  group.run('x += 1'):        {fmt_stats(s_run, 1e3, 'ms')}")
    print(f"  no-op Ray call to 2 actors: {fmt_stats(s_ray, 1e3, 'ms')}")
    print(f"  no-op on the 2 Worker actors: {fmt_stats(s_worker, 1e3, 'ms')}")
    print(f"  run / Worker floor, call by call: {fmt_stats(s_ratio, 1, 'x')} (95% CI of the median "
          f"{ci[0]:.2f}-{ci[1]:.2f})")
    print(f"  effect checked: x == {runs} on ranks {list(range(group.num_workers))}")
    return [
        Figure("1", "run('x += 1') latency, 2 workers", s_run["median"] * 1e3, "ms", "<", 3.0,
               spread=_spread(s_run),
               note=f"Ray no-op x2 floor {s_ray['median'] * 1e3:.2f} ms",
               detail={"run_s": s_run, "ray_noop_s": s_ray, "runs": runs, "x": xs}),
        Figure("1r", "run('x += 1') / no-op on the same Worker actors", s_ratio["median"], "x", "<", 1.5,
               spread=f"95% CI {ci[0]:.2f}-{ci[1]:.2f}",
               note=f"Worker no-op x2 floor {s_worker['median'] * 1e3:.2f} ms",
               detail={"worker_noop_s": s_worker, "ratio": s_ratio, "ci": ci}),
    ]


def run_magic(group: Any, calls: int = CALLS) -> List[Figure]:
    from raytrain_nb import active_group

    section("2. %%distributed cell through a real IPython InteractiveShell (interleaved)")
    os.environ["IPYTHONDIR"] = tempfile.mkdtemp(prefix="rtnb-bench-ipython-")  # history goes here, not ~
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "raytrain_nb")
    assert active_group() is group, "the magic must reuse the benchmark's group"

    from raytrain_nb._internal.output import CollectSink

    def magic() -> None:
        res = shell.run_cell("%%distributed\npass", store_history=True)
        if not res.success:
            res.raise_error()

    def plain() -> None:
        res = shell.run_cell("pass", store_history=True)
        if not res.success:
            res.raise_error()

    def direct() -> None:
        group.run("pass", sink=CollectSink())

    seq0 = len(group.history)
    samples = {"magic": [], "ipython": [], "direct": []}
    fns = {"magic": magic, "ipython": plain, "direct": direct}
    for i in range(WARMUP + calls):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            if i >= WARMUP:
                samples[name].append(time.perf_counter() - t0)
    assert active_group() is group
    ran = len(group.history) - seq0  # every %%distributed cell (and direct run) reached the group
    assert ran == 2 * (WARMUP + calls), f"the group ran {ran} cells, expected {2 * (WARMUP + calls)}"
    s = {k: stats(v) for k, v in samples.items()}
    print(f"  run_cell('%%distributed\\npass'): {fmt_stats(s['magic'], 1e3, 'ms')}")
    print(f"  run_cell('pass') (IPython alone): {fmt_stats(s['ipython'], 1e3, 'ms')}")
    print(f"  group.run('pass') (no IPython):   {fmt_stats(s['direct'], 1e3, 'ms')}")
    return [
        Figure("2", "%%distributed 'pass' via IPython", s["magic"]["median"] * 1e3, "ms", "<", 10.0,
               spread=_spread(s["magic"]),
               note=(f"IPython alone {s['ipython']['median'] * 1e3:.2f} ms, "
                     f"group.run {s['direct']['median'] * 1e3:.2f} ms"),
               detail={k: v for k, v in s.items()}),
    ]
