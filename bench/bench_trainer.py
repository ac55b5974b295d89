"""Script mode benchmark: the same small DDP job under raytrain_nb's TorchTrainer, plain
torch.multiprocessing + torch.distributed, and Ray Train's TorchTrainer (when ``ray[train]`` is
installed), in one run.

Figures (each variant runs the same loop: a 64-256-256-10 MLP, batch 64, SGD, gloo, 2 workers,
one torch thread per process):

- wall time of ``fit()`` (of ``mp.spawn`` for plain torch), the first call in this process and later ones;
- startup overhead: from the call to the first training step on rank 0 (Ray already started);
- steps/s measured inside the loop (after a warm-up), without reports and with ``report()``
  every ``--report-every`` steps; variants run interleaved for ``--rounds`` rounds (the order reversed
  every other round), medians compared;
- ratios vs the targets: startup <= 1/3 of Ray Train's, steps/s >= 0.95x plain torch, and
  >= 0.9x with reports.

Usage::

    .venv/bin/python bench/bench_trainer.py [--steps 1000] [--rounds 5] [--ray-rounds 2] [--report-every 100] [--settle 3]
                                            [--quick]
                                            [--no-ray-train]

Writes ``bench/results/trainer.json``. Standalone: ``bench/run_all.py`` can call :func:`main`
(``main(["--quick"])`` returns the figures as a list of dicts) or run it as a subprocess.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("RAYTRAIN_NB_NUM_CPUS", "6")  # the workers, Ray Train's controller, headroom
BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
if REPO_DIR not in sys.path:
    sys.path.insert(0, REPO_DIR)

WORLD = 2


# -- the loop every variant runs --------------------------------------------------------------

def run_steps(steps: int, report_every: int, report: Callable[[Dict[str, Any]], None], prepare: Callable,
              rank: int) -> Dict[str, float]:
    """Train ``steps`` DDP steps; returns the wall-clock time of the first step and steps/s after warm-up."""
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    import torch.nn.functional as F

    t_first = time.time()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
    model = prepare(net)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(1 + rank)
    x, y = torch.randn(64, 64, generator=gen), torch.randint(0, 10, (64,), generator=gen)
    warm = min(50, steps // 10)
    t0 = time.perf_counter()
    for i in range(steps):
        if i == warm:
            dist.barrier()
            t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        if report_every and (i + 1) % report_every == 0:
            report({"step": i, "loss": loss.item()})
    dist.barrier()
    return {"t_first": t_first, "steps_per_s": (steps - warm) / (time.perf_counter() - t0)}


def raytrain_nb_loop(config: Dict[str, Any]) -> None:
    import raytrain_nb as train
    from raytrain_nb.torch import prepare_model

    rank = train.get_context().get_world_rank()
    out = run_steps(config["steps"], config["report_every"], train.report, prepare_model, rank)
    train.report({"final": 1, **out})


def ray_train_loop(config: Dict[str, Any]) -> None:
    import ray.train as train
    from ray.train.torch import prepare_model

    rank = train.get_context().get_world_rank()
    out = run_steps(config["steps"], config["report_every"], train.report, prepare_model, rank)
    with tempfile.TemporaryDirectory() as d:  # Ray Train's Result.metrics are those of the last checkpoint
        open(os.path.join(d, "done"), "w").close()
        train.report({"final": 1, **out}, checkpoint=train.Checkpoint.from_directory(d) if rank == 0 else None)


def _plain_worker(rank: int, port: int, steps: int, report_every: int, queue: Any) -> None:
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        out = run_steps(steps, report_every, lambda m: None, DDP, rank)
        if rank == 0:
            queue.put(out)
    finally:
        dist.destroy_process_group()


# -- variants ---------------------------------------------------------------------------------

def plain_torch(steps: int) -> Dict[str, float]:
    import torch.multiprocessing as mp

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = mp.get_context("spawn")
    queue = ctx.SimpleQueue()
    t_call = time.time()
    started = time.perf_counter()
    mp.spawn(_plain_worker, args=(port, steps, 0, queue), nprocs=WORLD, join=True)
    wall = time.perf_counter() - started
    out = queue.get()
    return {"wall_s": wall, "startup_s": out["t_first"] - t_call, "steps_per_s": out["steps_per_s"]}


def _timed_fit(trainer: Any) -> Dict[str, float]:
    """Wall time of ``trainer.fit()``, its startup (call to the first step, from the loop's ``t_first``)
    and the steps/s the loop measured."""
    t_call = time.time()
    started = time.perf_counter()
    result = trainer.fit()
    wall = time.perf_counter() - started
    m = result.metrics
    return {"wall_s": wall, "startup_s": m["t_first"] - t_call, "steps_per_s": m["steps_per_s"]}


def ours(steps: int, report_every: int, storage: str) -> Dict[str, float]:
    from raytrain_nb import RunConfig, ScalingConfig
    from raytrain_nb.torch import TorchTrainer

    trainer = TorchTrainer(raytrain_nb_loop, train_loop_config={"steps": steps, "report_every": report_every},
                           scaling_config=ScalingConfig(num_workers=WORLD),
                           run_config=RunConfig(storage_path=storage, verbose=0))
    return _timed_fit(trainer)


def ray_train(steps: int, report_every: int, storage: str) -> Dict[str, float]:
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    trainer = TorchTrainer(ray_train_loop, train_loop_config={"steps": steps, "report_every": report_every},
                           scaling_config=ScalingConfig(num_workers=WORLD),
                           run_config=RunConfig(storage_path=storage, name=f"bench-{time.time_ns()}"))
    return _timed_fit(trainer)


def _have_ray_train() -> Optional[str]:
    try:
        import ray.train.torch  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return None


# -- the run ----------------------------------------------------------------------------------

def _line(name: str, r: Dict[str, float]) -> None:
    print(f"  {name:<44} fit {r['wall_s']:6.1f} s   startup {r['startup_s']:6.2f} s   "
          f"{r['steps_per_s']:7.1f} steps/s", flush=True)


def _median(xs: List[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def main(argv: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds (medians are reported)")
    parser.add_argument("--ray-rounds", type=int, default=2, help="rounds with Ray Train (about 50 s each)")
    parser.add_argument("--report-every", type=int, default=100)
    parser.add_argument("--settle", type=float, default=3.0, help="seconds between runs, so the processes of the "
                        "previous run have exited and Ray's worker pool has refilled before the next one")
    parser.add_argument("--quick", action="store_true", help="500 steps, 2 rounds (1 with Ray Train)")
    parser.add_argument("--no-ray-train", action="store_true", help="skip Ray Train even if installed")
    parser.add_argument("--out", default=os.path.join(BENCH_DIR, "results", "trainer.json"))
    args = parser.parse_args(argv)
    steps, rounds = (500, 2) if args.quick else (args.steps, args.rounds)
    args.ray_rounds = 1 if args.quick else args.ray_rounds
    every = args.report_every
    storage = tempfile.mkdtemp(prefix="bench-trainer-")
    import logging

    logging.getLogger("ray").setLevel(logging.ERROR)
    from raytrain_nb._internal import cluster

    print(f"bench_trainer: {WORLD} workers, {steps} steps, report every {every}, {rounds} interleaved rounds "
          f"(load average {os.getloadavg()[0]:.1f})", flush=True)
    t = time.perf_counter()
    cluster.connect()
    ray_init_s = time.perf_counter() - t
    print(f"  Ray started in {ray_init_s:.1f} s (not counted in any startup below)", flush=True)
    skipped = "--no-ray-train" if args.no_ray_train else _have_ray_train()
    variants: Dict[str, Callable[[], Dict[str, float]]] = {
        "plain": lambda: plain_torch(steps),
        "ours": lambda: ours(steps, 0, storage),
        "ours_report": lambda: ours(steps, every, storage),
    }
    labels = {"plain": "plain torch.multiprocessing + distributed", "ours": "raytrain_nb TorchTrainer",
              "ours_report": f"raytrain_nb, report() every {every} steps", "ray": "Ray Train TorchTrainer",
              "ray_report": f"Ray Train, report() every {every} steps"}
    if skipped is None:
        variants["ray"] = lambda: ray_train(steps, 0, storage)
        variants["ray_report"] = lambda: ray_train(steps, every, storage)
    else:
        print(f"  Ray Train: skipped ({skipped}); pip install -c constraints.txt 'ray[train]==2.60.0' to compare",
              flush=True)
    runs: Dict[str, List[Dict[str, float]]] = {k: [] for k in variants}
    for i in range(rounds):
        order = list(variants.items())
        for key, fn in (order if i % 2 == 0 else order[::-1]):  # A B C, then C B A: no variant always follows another
            if key.startswith("ray") and i >= args.ray_rounds:
                continue
            time.sleep(args.settle)
            runs[key].append(fn())
            _line(f"{labels[key]} [{i + 1}]", runs[key][-1])
    med = {k: {m: _median([r[m] for r in v]) for m in ("wall_s", "startup_s", "steps_per_s")} for k, v in runs.items()}
    first, later = runs["ours"][0], runs["ours"][1:] + runs["ours_report"]
    figures = [
        {"name": "steps/s vs plain torch.distributed (median)", "value": med["ours"]["steps_per_s"] /
         med["plain"]["steps_per_s"], "target": ">= 0.95"},
        {"name": f"steps/s with report() every {every} vs plain (median)", "value":
         med["ours_report"]["steps_per_s"] / med["plain"]["steps_per_s"], "target": ">= 0.9"},
        {"name": "startup of the first fit() in the process (s)", "value": first["startup_s"], "target": "info"},
        {"name": "startup of a later fit() in the process (s, median)",
         "value": _median([r["startup_s"] for r in later]), "target": "info"},
        {"name": "wall time of the first / a later fit() (s)", "value": first["wall_s"], "target": "info",
         "note": f"later: {_median([r['wall_s'] for r in runs['ours'][1:]] or [float('nan')]):.1f} s"},
        {"name": "startup of plain mp.spawn (s, median)", "value": med["plain"]["startup_s"], "target": "info"},
    ]
    if skipped is None:
        ray_first, ray_later = runs["ray"][0], runs["ray"][1:] + runs["ray_report"]
        figures += [
            {"name": "startup vs Ray Train's, first fit()", "value": first["startup_s"] / ray_first["startup_s"],
             "target": "<= 0.333", "note": f"Ray Train {ray_first['startup_s']:.1f} s"},
            {"name": "startup vs Ray Train's, later fit() (median)", "value":
             _median([r["startup_s"] for r in later]) / _median([r["startup_s"] for r in ray_later]),
             "target": "<= 0.333", "note": f"Ray Train {_median([r['startup_s'] for r in ray_later]):.1f} s"},
            {"name": "Ray Train steps/s vs plain (median)", "value": med["ray"]["steps_per_s"] /
             med["plain"]["steps_per_s"], "target": "info"},
            {"name": f"Ray Train steps/s, report() every {every}, vs plain", "value":
             med["ray_report"]["steps_per_s"] / med["plain"]["steps_per_s"], "target": "info"},
        ]
    print("\n  figure                                                  value    target")
    for f in figures:
        ok = ""
        if f["target"].startswith(">="):
            ok = "ok" if f["value"] >= float(f["target"][3:]) else "MISSED"
        elif f["target"].startswith("<="):
            ok = "ok" if f["value"] <= float(f["target"][3:]) else "MISSED"
        f["status"] = ok or "info"
        print(f"  {f['name']:<54} {f['value']:7.3f}   {f['target']:<8} {ok}  {f.get('note', '')}")
    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump({"steps": steps, "rounds": rounds, "report_every": every, "ray_init_s": ray_init_s, "runs": runs,
                   "medians": med, "figures": figures, "ray_train_skipped": skipped, "loadavg": os.getloadavg()},
                  fh, indent=1)
    print(f"\n  written to {args.out}")
    return figures


def run(quick: bool = False) -> List[Any]:
    """Section 10 of ``bench/run_all.py``: :func:`main` in a fresh process (a Ray of its own, sized
    for Ray Train's controller too), its figures returned as ``common.Figure``."""
    import subprocess

    if BENCH_DIR not in sys.path:
        sys.path.insert(0, BENCH_DIR)
    from common import RESULTS_DIR, Figure, section

    section("10. script mode: fit() under raytrain_nb, plain torch.distributed and Ray Train (own process)")
    out = os.path.join(RESULTS_DIR, "trainer.json")
    env = {k: v for k, v in os.environ.items() if k != "RAYTRAIN_NB_NUM_CPUS"}  # sections before may size Ray
    subprocess.run([sys.executable, os.path.abspath(__file__), "--out", out] + (["--quick"] if quick else []),
                   env=env, check=True, timeout=3600)
    with open(out) as fh:
        raw = json.load(fh)["figures"]
    figures = []
    for i, f in enumerate(raw):
        op, target = "info", 0.0
        if f["target"] != "info":
            op = ">=" if f["target"].startswith(">=") else "<"
            target = float(f["target"][3:])
        unit = "x" if op != "info" else ("s" if "(s" in f["name"] else "x")
        figures.append(Figure(f"10{chr(ord('a') + i)}", f["name"], f["value"], unit, op, target,
                              note=f.get("note", "")))
    return figures


if __name__ == "__main__":
    main()
