"""Figures 3 and 4: DDP steps/s through the group vs plain torch.distributed, and with report().

One ``run()`` of a cell that loops N steps; timed on the worker (perf_counter around the loop,
after a barrier) and end to end (driver around ``run()``). The baseline is the same cell source
in two ``torch.multiprocessing.spawn`` processes (gloo) that stay up and take the cell from a
queue, timed the same two ways. Group, baseline and group-with-report runs are interleaved.
"""
from __future__ import annotations

import socket
import time
from typing import Any, Dict, List

from common import Figure, alternate, fmt_stats, section, stats
from workload import baseline_child, loop_cell

STEPS = 400
ROUNDS = 6


class Baseline:
    """Two plain torch.distributed processes (gloo) started once with ``torch.multiprocessing.spawn``."""

    def __init__(self, world: int = 2) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.world = world
        self.commands = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.procs = mp.spawn(baseline_child, args=(world, port, self.commands, self.results),
                              nprocs=world, join=False)

    def run(self, source: str) -> Dict[str, float]:
        t0 = time.perf_counter()
        for q in self.commands:
            q.put(source)
        got = [self.results.get(timeout=600) for _ in range(self.world)]
        e2e = time.perf_counter() - t0
        return {"loop": max(g[1] for g in got), "e2e": e2e}

    def close(self) -> None:
        for q in self.commands:
            q.put(None)
        try:
            self.procs.join(timeout=30)
        except Exception:  # noqa: BLE001
            for p in self.procs.processes:
                if p.is_alive():
                    p.kill()


def _group_run(group: Any, source: str) -> Dict[str, float]:
    from raytrain_nb._internal.output import CollectSink

    t0 = time.perf_counter()
    group.run(source, sink=CollectSink())
    e2e = time.perf_counter() - t0
    loops = group.pull("elapsed", rank=None)
    return {"loop": max(loops), "e2e": e2e}


def run(group: Any, steps: int = STEPS, rounds: int = ROUNDS) -> List[Figure]:
    section(f"3/4. DDP throughput: MLP 64-256-256-10, batch 64, SGD, 2 ranks gloo, {steps} steps per run")
    baseline = Baseline()
    plain_cell, report_cell = loop_cell(steps), loop_cell(steps, report=True)
    reports_before = sum(len(h) for h in group.metrics_history.values())
    try:
        samples = alternate({
            "group": lambda: _group_run(group, plain_cell),
            "torch": lambda: baseline.run(plain_cell),
            "group+report": lambda: _group_run(group, report_cell),
        }, rounds=rounds, warmup=1)
    finally:
        baseline.close()
    reports = sum(len(h) for h in group.metrics_history.values()) - reports_before
    expected = (rounds + 1) * steps * group.num_workers
    assert reports == expected, f"report() records reaching the driver: {reports}, expected {expected}"

    rate: Dict[str, Dict[str, Dict[str, float]]] = {}
    for name, runs in samples.items():
        rate[name] = {kind: stats([steps / r[kind] for r in runs]) for kind in ("loop", "e2e")}
        for kind in ("loop", "e2e"):
            print(f"  {name:13s} {kind:4s} steps/s: {fmt_stats(rate[name][kind], digits=1)}")

    def ratio(a: str, b: str, kind: str) -> Dict[str, float]:
        # Pair each round's runs (they ran next to each other).
        return stats([(steps / ra[kind]) / (steps / rb[kind]) for ra, rb in zip(samples[a], samples[b])])

    figs = []
    for kind, what in (("loop", "worker-side loop"), ("e2e", "end to end")):
        r = ratio("group", "torch", kind)
        print(f"  ratio group/torch ({what}): {fmt_stats(r, digits=3)}")
        figs.append(Figure(
            key=f"3{'a' if kind == 'loop' else 'b'}", label=f"DDP steps/s group/torch ({what})",
            value=r["median"], unit="x", op=">=", target=0.97,
            spread=f"IQR {r['q1']:.3f}-{r['q3']:.3f}, min-max {r['min']:.3f}-{r['max']:.3f}, n={r['n']}",
            note=f"group {rate['group'][kind]['median']:.0f} vs torch {rate['torch'][kind]['median']:.0f} steps/s",
            detail={"ratio": r, "group": rate["group"][kind], "torch": rate["torch"][kind], "steps": steps}))
    for kind, what in (("loop", "worker-side loop"), ("e2e", "end to end")):
        r = ratio("group+report", "group", kind)
        print(f"  ratio report-every-step/never ({what}): {fmt_stats(r, digits=3)}")
        figs.append(Figure(
            key=f"4{'a' if kind == 'loop' else 'b'}", label=f"steps/s report every step/never ({what})",
            value=r["median"], unit="x", op=">=", target=0.95,
            spread=f"IQR {r['q1']:.3f}-{r['q3']:.3f}, min-max {r['min']:.3f}-{r['max']:.3f}, n={r['n']}",
            note=f"{rate['group+report'][kind]['median']:.0f} vs {rate['group'][kind]['median']:.0f} steps/s",
            detail={"ratio": r, "report": rate["group+report"][kind], "never": rate["group"][kind],
                    "records_received": reports}))
    return figs
