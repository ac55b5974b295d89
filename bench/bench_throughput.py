"""Figures 3 and 4: DDP steps/s through the group vs plain torch.distributed, and with report().

One ``run()`` of a cell that loops N steps; timed on the worker (perf_counter around the loop,
after a barrier) and end to end (driver around ``run()``). The baseline is the same cell source
in two ``torch.multiprocessing.spawn`` processes (gloo) that stay up and take the cell from a
queue, timed the same two ways. Group, baseline and group-with-report runs are interleaved.
"""
from __future__ import annotations

import os
import socket
import time
from typing import Any, Dict, Iterable, List

from bench_report import pre_ledger_hook, report_ab_figures, report_cost
from common import Figure, alternate, fmt_stats, median_ci, ray_session_pids, section, stats
from workload import baseline_child, loop_cell

STEPS = 100
ROUNDS = 30


class Baseline:
    """Two plain torch.distributed processes (gloo) started once with ``torch.multiprocessing.spawn``."""

    def __init__(self, world: int = 2, nice: int = 0) -> None:
        import torch.multiprocessing as mp

        ctx = mp.get_context("spawn")
        self.world = world
        self.commands = [ctx.Queue() for _ in range(world)]
        self.results = ctx.Queue()
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.procs = mp.spawn(baseline_child, args=(world, port, self.commands, self.results, nice),
                              nprocs=world, join=False)

    def pids(self) -> List[int]:
        return [os.getpid(), *self.procs.pids()]

    def run(self, source: str) -> Dict[str, float]:
        c0 = tree_cpu(self.pids())
        t0 = time.perf_counter()
        for q in self.commands:
            q.put(source)
        got = [self.results.get(timeout=600) for _ in range(self.world)]
        e2e = time.perf_counter() - t0
        return {"loop": max(g[1] for g in got), "e2e": e2e, "rank_cpu": sum(g[3] for g in got),
                "tree_cpu": tree_cpu(self.pids()) - c0}

    def close(self) -> None:
        for q in self.commands:
            q.put(None)
        try:
            self.procs.join(timeout=30)
        except Exception:  # noqa: BLE001
            for p in self.procs.processes:
                if p.is_alive():
                    p.kill()


def cpu_by_pid(pids: Iterable[int]) -> Dict[int, float]:
    """CPU seconds (user + system, every thread) spent so far by each of these processes."""
    out: Dict[int, float] = {}
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            out[pid] = (int(fields[11]) + int(fields[12])) / _TICKS
        except (OSError, IndexError, ValueError):
            continue
    return out


def tree_cpu(pids: Iterable[int]) -> float:
    return sum(cpu_by_pid(pids).values())


_TICKS = os.sysconf("SC_CLK_TCK")


def _group_pids(group: Any) -> Dict[int, str]:
    """This driver and every process of the Ray instance it started, by role."""
    import ray

    session_dir = ray._private.worker._global_node.get_session_dir_path()
    workers = {s.info.get("pid"): f"rank {i}" for i, s in enumerate(group.slots)}
    roles = {os.getpid(): "driver"}
    for pid, name in ray_session_pids(os.getpid(), session_dir).items():
        roles[pid] = workers.get(pid) or ("other Ray processes" if name not in ("raylet", "gcs_server") else name)
    return roles


def _group_run(group: Any, source: str, roles: Dict[int, str]) -> Dict[str, Any]:
    from raytrain_nb._internal.output import CollectSink

    c0 = cpu_by_pid(roles)
    t0 = time.perf_counter()
    group.run(source, sink=CollectSink())
    e2e = time.perf_counter() - t0
    c1 = cpu_by_pid(roles)
    loops = group.pull("elapsed", rank=None)
    cpus = group.pull("cpu_time", rank=None)
    by_role: Dict[str, float] = {}
    for pid, c in c1.items():
        by_role[roles[pid]] = by_role.get(roles[pid], 0.0) + c - c0.get(pid, c)
    return {"loop": max(loops), "e2e": e2e, "rank_cpu": sum(cpus), "tree_cpu": sum(by_role.values()),
            "by_role": by_role}


def _worker_niceness(group: Any) -> int:
    import psutil

    try:
        return psutil.Process(group.slots[0].info["pid"]).nice()
    except Exception:  # noqa: BLE001 - a remote worker: not visible from here
        return 0


def _ratio_figure(key: str, label: str, target: float, r: Dict[str, float], note: str,
                  detail: Dict[str, Any], info: bool = False) -> Figure:
    lo, hi = r["ci95"]
    return Figure(key=key, label=label, value=r["median"], unit="x", op="info" if info else ">=", target=target,
                  spread=(f"95% CI of median {lo:.3f}-{hi:.3f}, IQR {r['q1']:.3f}-{r['q3']:.3f}, "
                          f"min-max {r['min']:.3f}-{r['max']:.3f}, n={r['n']}"),
                  note=note, detail=detail)


def _slow_poll_run(group: Any, source: str, roles: Dict[int, str], interval: float) -> Dict[str, Any]:
    """A group run with the driver's output/metrics poll every ``interval`` s (diagnostic only:
    patches the module constant for this run, restores it after)."""
    from raytrain_nb._internal.group import timing as group_mod

    old = group_mod.POLL_INTERVAL_S
    group_mod.POLL_INTERVAL_S = interval
    try:
        return _group_run(group, source, roles)
    finally:
        group_mod.POLL_INTERVAL_S = old


SLOW_POLL_S = 1.0


def _pre_ledger_run(group: Any, source: str, roles: Dict[int, str]) -> Dict[str, Any]:
    """A group run of ``source`` with every rank's report() hook as it was before the ledger (diagnostic)."""
    group.execute(pre_ledger_hook, True)
    try:
        return _group_run(group, source, roles)
    finally:
        group.execute(pre_ledger_hook, False)


def run(group: Any, steps: int = STEPS, rounds: int = ROUNDS) -> List[Figure]:
    section(f"3/4. DDP throughput: MLP 64-256-256-10, batch 64, SGD, 2 ranks gloo, {steps} steps per run")
    nice = _worker_niceness(group)
    if nice:
        print(f"  the group's workers run at niceness {nice} (Ray's default for worker processes); the plain-torch "
              f"baseline runs twice: at niceness 0 (as a user runs it) and at {nice} (a control for CPU contention)")
    baseline = Baseline()
    niced = Baseline(nice=nice) if nice else None
    plain_cell, report_cell = loop_cell(steps), loop_cell(steps, report=True)
    reports_before = sum(len(h) for h in group.metrics_history.values())
    roles = _group_pids(group)
    variants = {
        "group": lambda: _group_run(group, plain_cell, roles),
        "torch": lambda: baseline.run(plain_cell),
        "group+report": lambda: _group_run(group, report_cell, roles),
        "group+report@pre-ledger": lambda: _pre_ledger_run(group, report_cell, roles),
    }
    if niced is not None:
        variants["torch@nice"] = lambda: niced.run(plain_cell)
    from raytrain_nb._internal.group import timing as group_mod

    if hasattr(group_mod, "POLL_INTERVAL_S"):
        print(f"  diagnostic variant 'group@poll{SLOW_POLL_S:g}s': the driver polls output every {SLOW_POLL_S:g} s "
              f"instead of every {group_mod.POLL_INTERVAL_S:g} s")
        variants["group@poll1s"] = lambda: _slow_poll_run(group, plain_cell, roles, SLOW_POLL_S)
    try:
        samples = alternate(variants, rounds=rounds, warmup=1)
    finally:
        baseline.close()
        if niced is not None:
            niced.close()
    reports = sum(len(h) for h in group.metrics_history.values()) - reports_before
    expected = 2 * (rounds + 1) * steps * group.num_workers  # the report cells, with and without the ledger
    assert reports == expected, f"report() records reaching the driver: {reports}, expected {expected}"

    rate: Dict[str, Dict[str, Dict[str, float]]] = {}
    for name, runs in samples.items():
        rate[name] = {kind: stats([steps / r[kind] for r in runs]) for kind in ("loop", "e2e")}
        for kind in ("loop", "e2e"):
            print(f"  {name:13s} {kind:4s} steps/s: {fmt_stats(rate[name][kind], digits=1)}")

    def ratio(a: str, b: str, kind: str) -> Dict[str, float]:
        # Each round's runs ran next to each other: pair them, then take the median of the ratios.
        xs = [rb[kind] / ra[kind] for ra, rb in zip(samples[a], samples[b])]
        out: Dict[str, Any] = dict(stats(xs))
        out["ci95"] = median_ci(xs)
        return out

    def best(a: str, b: str, kind: str) -> float:
        # Least disturbed run of each (robust to load from elsewhere on the machine).
        return min(r[kind] for r in samples[b]) / min(r[kind] for r in samples[a])

    figs = []
    for kind, what in (("loop", "worker-side loop"), ("e2e", "end to end")):
        r = ratio("group", "torch", kind)
        print(f"  ratio group/torch ({what}): {fmt_stats(r, digits=3)}; 95% CI of median "
              f"{r['ci95'][0]:.3f}-{r['ci95'][1]:.3f}; best run vs best run "
              f"{best('group', 'torch', kind):.3f}")
        figs.append(_ratio_figure(
            f"3{'a' if kind == 'loop' else 'b'}", f"DDP steps/s group/torch ({what})", 0.97, r,
            f"group {rate['group'][kind]['median']:.0f} vs torch {rate['torch'][kind]['median']:.0f} steps/s",
            {"ratio": r, "group": rate["group"][kind], "torch": rate["torch"][kind], "steps": steps,
             "best_over_best": best("group", "torch", kind), "worker_niceness": nice}))
    if niced is not None:
        r = ratio("group", "torch@nice", "loop")
        print(f"  ratio group/torch at niceness {nice} (worker-side loop): {fmt_stats(r, digits=3)}; best run vs "
              f"best run {best('group', 'torch@nice', 'loop'):.3f}")
        figs.append(_ratio_figure(
            "3c", f"control: group/torch both at niceness {nice} (loop)", 0.97, r,
            f"torch@nice {rate['torch@nice']['loop']['median']:.0f} steps/s",
            {"ratio": r, "torch_nice": rate["torch@nice"]["loop"], "best_over_best": best("group", "torch@nice", "loop")},
            info=True))
    # CPU cost per step, robust to load from elsewhere: ranks' own processes, and the whole tree
    # (group: driver + every Ray process; torch: parent + 2 children).
    for kind, what in (("rank_cpu", "ranks' processes"), ("tree_cpu", "whole process tree")):
        for name in ("group", "torch", "group+report"):
            per = stats([1e3 * r[kind] / steps for r in samples[name]])
            print(f"  {name:13s} CPU ms per step, {what}: {fmt_stats(per, digits=3)}")
    for name in [n for n in ("group", "group+report", "group@poll1s") if n in samples]:
        roles_cpu: Dict[str, float] = {}
        wall = sum(r["e2e"] for r in samples[name])
        for r in samples[name]:
            for role, c in r["by_role"].items():
                roles_cpu[role] = roles_cpu.get(role, 0.0) + c
        print(f"  {name} CPU by process while cells ran (ms per step / % of one core): " + ", ".join(
            f"{role} {1e3 * c / (steps * len(samples[name])):.3f}/{100 * c / wall:.1f}%"
            for role, c in sorted(roles_cpu.items(), key=lambda kv: -kv[1])))
    for key, kind, what in (("3d", "rank_cpu", "ranks' CPU"), ("3e", "tree_cpu", "whole tree's CPU")):
        r = ratio("group", "torch", kind)
        figs.append(_ratio_figure(
            key, f"diagnostic: CPU per step torch/group ({what})", 0.97, r,
            f"group {1e3 * stats([x[kind] for x in samples['group']])['median'] / steps:.2f} vs torch "
            f"{1e3 * stats([x[kind] for x in samples['torch']])['median'] / steps:.2f} CPU ms/step",
            {"ratio": r}, info=True))
    if "group@poll1s" in samples:
        r = ratio("group", "group@poll1s", "loop")
        print(f"  ratio group/group@poll{SLOW_POLL_S:g}s (worker-side loop): {fmt_stats(r, digits=3)}")
        figs.append(_ratio_figure(
            "3f", f"diagnostic: group poll 0.1 s / poll {SLOW_POLL_S:g} s (loop)", 0.97, r,
            f"{rate['group']['loop']['median']:.0f} vs {rate['group@poll1s']['loop']['median']:.0f} steps/s",
            {"ratio": r, "slow_poll": rate["group@poll1s"]["loop"]}, info=True))
    costs = group.execute(report_cost)
    per_call = max(c["per_call"] for c in costs)
    print("  garbage collections while report() was timed: " + ", ".join(
        f"rank {r} {1e3 * c['gc_s']:.1f} ms ({c['full']} full)" for r, c in enumerate(costs)))
    step_s = 1.0 / rate["group"]["loop"]["median"]
    print(f"  report() call on a worker: {per_call * 1e6:.1f} us = {100 * per_call / step_s:.2f}% of a "
          f"{step_s * 1e3:.2f} ms step (the driver drains records on its 0.1 s poll)")
    figs.append(Figure("4c", "diagnostic: report() call cost / step time", 100 * per_call / step_s, "%", "info",
                       5.0, note=f"{per_call * 1e6:.1f} us per call, step {step_s * 1e3:.2f} ms; earlier garbage "
                       f"collected first, collections in the window {1e3 * max(c['gc_s'] for c in costs):.1f} ms",
                       detail={"per_rank": costs}))
    for kind, what in (("loop", "worker-side loop"), ("e2e", "end to end")):
        r = ratio("group+report", "group", kind)
        print(f"  ratio report-every-step/never ({what}): {fmt_stats(r, digits=3)}; best run vs best run "
              f"{best('group+report', 'group', kind):.3f}")
        figs.append(_ratio_figure(
            f"4{'a' if kind == 'loop' else 'b'}", f"steps/s report every step/never ({what})", 0.95, r,
            f"{rate['group+report'][kind]['median']:.0f} vs {rate['group'][kind]['median']:.0f} steps/s",
            {"ratio": r, "report": rate["group+report"][kind], "never": rate["group"][kind],
             "records_received": reports, "best_over_best": best("group+report", "group", kind)}))
    r = ratio("group+report", "group+report@pre-ledger", "loop")
    print(f"  ratio report-every-step with the ledger/without (worker-side loop): {fmt_stats(r, digits=3)}")
    figs.append(_ratio_figure(
        "4h", "diagnostic: steps/s reporting every step, ledger/pre-ledger hook (loop)", 0.99, r,
        f"{rate['group+report']['loop']['median']:.0f} vs {rate['group+report@pre-ledger']['loop']['median']:.0f} "
        "steps/s", {"ratio": r}, info=True))
    return figs + report_ab_figures(group)
