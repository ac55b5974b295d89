"""Section 19: what looking inside a group costs and how fast it answers (``python bench/bench_inspect.py [--quick]``).

19a. Training throughput with each rank's resources sampled (once a second, in the polls of the running cell) vs
     not sampled: the DDP workload of ``workload.py`` reporting every step, in runs interleaved on/off (the sampler
     is switched off on the workers by replacing its method). Target: the slowdown's 95 % interval (bootstrap of the
     median of paired on/off ratios) within 2 %.
19a'. The sampler's own CPU time per second of training (one sample's thread CPU time, at one sample a second), on
     every rank: what 19a bounds, measured without the noise of the machine's other work. Target: under 2 %.
19b. Time from ``group.where()`` (what ``%dist_where`` and the Where button call) to every rank's stack, on a
     2-rank group while rank 1 sleeps and rank 0 waits in ``all_reduce``. Target: median under 1 s.
19c. The same on an 8-rank group (the embedded instance shares its CPUs among the ranks). Target: median under 1 s.
"""
from __future__ import annotations

import os
import sys
import time
from typing import Any, Dict, List

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import Figure, fmt_stats, median_ci, section, single_thread, stats  # noqa: E402

STEPS = 3000
ROUNDS = 8
WHERE_CALLS = 30
#: rank 1 sleeps while every other rank waits for it in all_reduce (the cell %dist_where is for).
STUCK_CELL = """
import time, torch, torch.distributed as dist
if train.get_context().get_world_rank() == 1:
    time.sleep({sleep})
dist.all_reduce(torch.ones(1))
"""


def _sampling(on: bool) -> None:
    """On a worker: resources sampled as shipped (``on``) or never (the sample is empty)."""
    from raytrain_nb._internal.worker import resources

    original = getattr(resources, "_bench_original", None) or resources.ResourceSampler.sample
    resources._bench_original = original
    resources.ResourceSampler.sample = original if on else (lambda self: {})


def _sample_cost(calls: int) -> List[float]:
    """On a worker: the CPU seconds of each of ``calls`` fresh samples (what one tick of the sampler costs)."""
    from raytrain_nb._internal.worker.resources import ResourceSampler

    sampler = ResourceSampler(every_s=0.0)
    sampler.sample()  # psutil's import and the process handle: paid once per process
    out = []
    for _ in range(calls):
        t0 = time.thread_time()
        sampler.sample()
        out.append(time.thread_time() - t0)
    return out


def run_sample_cost(group: Any, calls: int = 200) -> List[Figure]:
    """19a': the sampler's own CPU time per second of training (it samples at most once a second), on every rank;
    unlike 19a it does not depend on what else the machine runs."""
    from raytrain_nb._internal.worker.resources import SAMPLE_EVERY_S

    per_rank = group.execute(_sample_cost, calls, output="none")
    times = [t for rank in per_rank for t in rank]
    s = stats(times)
    share = 100.0 * s["median"] / SAMPLE_EVERY_S
    print(f"  one sample: {fmt_stats(s, 1e6, 'us', 0)} of CPU; at one sample per {SAMPLE_EVERY_S:g} s that is "
          f"{share:.3f} % of one core")
    return [Figure("19a'", "resources sampled: the sampler's CPU time per second of training", share, "%", "<", 2.0,
                   spread=f"one sample {s['median'] * 1e6:.0f} us (IQR {s['q1'] * 1e6:.0f}-{s['q3'] * 1e6:.0f}), "
                   f"n={s['n']}", note="load-independent: CPU time of the sample itself, every rank")]


def run_sampling(group: Any, steps: int = STEPS, rounds: int = ROUNDS) -> List[Figure]:
    from raytrain_nb._internal.output import CollectSink
    from workload import loop_cell

    section(f"19a. DDP steps/s, resources sampled vs not, report() every step, {steps} steps x {rounds} rounds "
            "(interleaved)")
    cell = loop_cell(steps, report=True)

    def once(on: bool) -> float:
        group.execute(_sampling, on, output="none")
        group.run(cell, sink=CollectSink())
        return steps / group.pull("elapsed", rank=0)

    once(True), once(False)  # warm-up
    rates: Dict[str, List[float]] = {"on": [], "off": []}
    for i in range(rounds):
        for name in (("on", "off") if i % 2 == 0 else ("off", "on")):
            rates[name].append(once(name == "on"))
    group.execute(_sampling, True, output="none")
    slow = [100.0 * (1.0 - on / off) for on, off in zip(rates["on"], rates["off"])]
    lo, hi = median_ci(slow)
    s = stats(slow)
    print(f"  sampled {fmt_stats(stats(rates['on']), 1, 'steps/s', 0)}; "
          f"not {fmt_stats(stats(rates['off']), 1, 'steps/s', 0)}")
    print(f"  slowdown {fmt_stats(s, 1, '%', 2)}; 95 % interval of the median {lo:+.2f} to {hi:+.2f} %")
    return [Figure("19a", "resources sampled: slowdown, upper end of 95 % interval", hi, "%", "<", 2.0,
                   spread=f"median {s['median']:+.2f} %, interval {lo:+.2f} to {hi:+.2f} %, n={s['n']}",
                   detail=rates)]


def run_where(group: Any, key: str, calls: int = WHERE_CALLS) -> List[Figure]:
    from raytrain_nb._internal.output import CollectSink

    n = group.num_workers
    section(f"{key}. group.where() -> every rank's stack, {n} ranks, rank 1 sleeping, the others in all_reduce")
    bg = group.run(STUCK_CELL.format(sleep=calls * 0.5 + 10), sink=CollectSink(), background=True)
    try:
        deadline = time.monotonic() + 60
        while "all_reduce" not in group.where().line() and time.monotonic() < deadline:
            time.sleep(0.1)
        times, line = [], ""
        for _ in range(calls):
            t0 = time.perf_counter()
            line = group.where().line()
            times.append(time.perf_counter() - t0)
    finally:
        group.interrupt()
        try:
            bg.wait()
        except Exception:  # noqa: BLE001 - the interrupted cell fails, as it should
            pass
    s = stats(times)
    print(f"  {fmt_stats(s, 1e3, 'ms', 1)}; said: {line}")
    return [Figure(key, f"where() -> every rank's stack, {n} ranks (median)", s["median"] * 1e3, "ms", "<", 1000.0,
                   spread=f"IQR {s['q1'] * 1e3:.0f}-{s['q3'] * 1e3:.0f}, max {s['max'] * 1e3:.0f} ms, n={s['n']}",
                   note=line[:120], detail={"seconds": times})]


def run(quick: bool = False) -> List[Figure]:
    """Figures 19a-19c, on groups of their own (2 ranks, then 8)."""
    single_thread()
    os.environ.setdefault("RAYTRAIN_NB_NUM_CPUS", "4")
    import torch

    torch.set_num_threads(1)
    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal.output import CollectSink
    from workload import GROUP_SETUP

    section("19. looking inside a group: the sampling's cost, where() at 2 and 8 ranks")
    figures: List[Figure] = []
    two = WorkerGroup(2)
    try:
        two.run(GROUP_SETUP, sink=CollectSink())
        figures += run_sampling(two, steps=300 if quick else STEPS, rounds=2 if quick else ROUNDS)
        figures += run_sample_cost(two, calls=20 if quick else 200)
        figures += run_where(two, "19b", calls=5 if quick else WHERE_CALLS)
    finally:
        two.shutdown()
    eight = WorkerGroup(8, cpus_per_worker=0.5)
    try:
        eight.run("import raytrain_nb as train", sink=CollectSink())
        figures += run_where(eight, "19c", calls=5 if quick else WHERE_CALLS)
    finally:
        eight.shutdown()
    return figures


def main() -> int:
    from common import run_standalone

    return run_standalone(run, __doc__, "inspect", "fewer repetitions (a smoke run)")


if __name__ == "__main__":
    sys.exit(main())
