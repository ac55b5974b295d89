"""Tune benchmark: the same small sweep through raytrain_nb + Ray Tune and through Ray Train + Ray Tune, in one run.

The sweep (Ray Train 2.60's pattern in both): a Tune function trainable builds a ``TorchTrainer``
(2 workers, gloo, 0.5 CPU each) with ``TuneReportCallback`` and calls ``fit()``; 4 trials (one
per learning rate), at most 2 at once, each trial's function at 0.1 CPU; each run trains a
64-256-256-10 MLP for ``EPOCHS`` epochs of ``STEPS`` steps and reports once per epoch (rank 0
with a checkpoint). No scheduler: both sides do the same work. Variants run interleaved.

Figures:

- wall time of ``Tuner.fit()`` (the whole sweep), ours vs Ray Train's (target: ours < 1/3);
- time to every trial's first step: from the moment the trial's function starts to the first
  training step on rank 0 (median and worst over the trials).

Usage::

    .venv/bin/python bench/bench_tune.py [--rounds 2] [--quick]

Writes ``bench/results/tune.json``; ``bench/run_all.py`` (section 11) calls :func:`run`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYTRAIN_NB_NUM_CPUS", "4")
BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
for _p in (REPO_DIR, BENCH_DIR):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from common import RESULTS_DIR, Figure, loadavg, section  # noqa: E402

EPOCHS = 3
STEPS = 20
LRS = [0.1, 0.05, 0.02, 0.01]


def train_func(config: Dict[str, Any]) -> None:
    """Each worker: a few epochs of DDP steps; rank 0 reports when its first step ran and a checkpoint per epoch."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    train, prepare_model, checkpoint_cls = config["api"]()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = prepare_model(nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                        nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=config["lr"])
    x, y = torch.randn(64, 64), torch.randint(0, 10, (64,))
    first_step_at = None
    rank = train.get_context().get_world_rank()
    for epoch in range(EPOCHS):
        for _ in range(STEPS):
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            if first_step_at is None:
                first_step_at = time.time()
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint = None
            if rank == 0:
                torch.save(model.module.state_dict(), os.path.join(tmp, "model.pt"))
                checkpoint = checkpoint_cls.from_directory(tmp)
            train.report({"epoch": epoch, "loss": loss.item(), "to_first_step_s": first_step_at - config["started"]},
                         checkpoint=checkpoint)


def ours_api() -> Any:
    import raytrain_nb
    from raytrain_nb.torch import prepare_model

    return raytrain_nb, prepare_model, raytrain_nb.Checkpoint


def ray_api() -> Any:
    import ray.train
    from ray.train.torch import prepare_model

    return ray.train, prepare_model, ray.train.Checkpoint


def ours_driver(config: Dict[str, Any]) -> None:
    """A trial on raytrain_nb (the run is named after the trial by itself)."""
    from raytrain_nb import RunConfig, ScalingConfig
    from raytrain_nb.torch import TorchTrainer
    from raytrain_nb.tune import TuneReportCallback

    loop = dict(config, started=time.time(), api=ours_api)
    TorchTrainer(train_func, train_loop_config=loop,
                 scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                 run_config=RunConfig(storage_path=config["storage"], callbacks=[TuneReportCallback()],
                                      verbose=0)).fit()


def ray_driver(config: Dict[str, Any]) -> None:
    """The same trial on Ray Train (a unique run name per trial, as Ray's guide asks)."""
    from ray import tune
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    loop = dict(config, started=time.time(), api=ray_api)
    TorchTrainer(train_func, train_loop_config=loop,
                 scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}),
                 run_config=RunConfig(name=f"train-{tune.get_context().get_trial_id()}",
                                      storage_path=config["storage"], callbacks=[TuneReportCallback()])).fit()


def sweep(driver: Any, storage: str, name: str) -> Dict[str, Any]:
    """One sweep; its wall time and each trial's time to its first step."""
    from ray import tune

    tuner = tune.Tuner(tune.with_resources(driver, {"cpu": 0.1}),
                       param_space={"lr": tune.grid_search(LRS), "storage": storage},
                       tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2),
                       run_config=tune.RunConfig(name=name, storage_path=storage, verbose=0))
    t0 = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - t0
    if results.errors:
        raise RuntimeError(f"{name}: {results.errors[0]}")
    firsts = [r.metrics["to_first_step_s"] for r in results]
    return {"wall_s": wall, "to_first_step_s": firsts, "iterations": [r.metrics["training_iteration"] for r in results]}


def run(quick: bool = False, rounds: int = 2) -> List[Figure]:
    """Run ``rounds`` (1 when ``quick``) interleaved pairs of sweeps; return the figures."""
    import ray.cloudpickle

    from raytrain_nb._internal import cluster

    rounds = 1 if quick else rounds
    section(f"11. Tune: 4 trials x 2 workers, 2 at once, through raytrain_nb and Ray Train ({rounds} round(s))")
    cluster.connect()
    me = sys.modules[__name__]
    if __name__ != "__main__":  # trial actors and workers get these functions by value
        ray.cloudpickle.register_pickle_by_value(me)
    out: Dict[str, List[Dict[str, Any]]] = {"raytrain_nb": [], "ray_train": []}
    with tempfile.TemporaryDirectory(prefix="bench-tune-") as storage:
        for i in range(rounds):
            order = [("raytrain_nb", ours_driver), ("ray_train", ray_driver)]
            for label, driver in (order if i % 2 == 0 else order[::-1]):
                m = sweep(driver, storage, f"{label}-{i}")
                out[label].append(m)
                print(f"  {label:12s} round {i}: sweep {m['wall_s']:.1f} s; to first step per trial "
                      + ", ".join(f"{s:.1f}" for s in m["to_first_step_s"]) + " s", flush=True)
    if __name__ != "__main__":
        ray.cloudpickle.unregister_pickle_by_value(me)
    wall = {k: statistics.median(m["wall_s"] for m in v) for k, v in out.items()}
    first = {k: [s for m in v for s in m["to_first_step_s"]] for k, v in out.items()}
    ratio = wall["raytrain_nb"] / wall["ray_train"]
    figures = [
        Figure("11a", "Tune sweep wall time, raytrain_nb / Ray Train", ratio, "x", "<", 1 / 3,
               spread=f"{wall['raytrain_nb']:.1f} s vs {wall['ray_train']:.1f} s (median of {rounds})",
               detail={"runs": out, "load_average": loadavg()}),
        Figure("11b", "Tune sweep wall time, raytrain_nb", wall["raytrain_nb"], "s", "info", wall["ray_train"]),
        Figure("11c", "trial start to first step, raytrain_nb (median)", statistics.median(first["raytrain_nb"]), "s",
               "info", statistics.median(first["ray_train"]),
               spread=f"worst {max(first['raytrain_nb']):.1f} s; Ray Train median "
                      f"{statistics.median(first['ray_train']):.1f} s, worst {max(first['ray_train']):.1f} s"),
    ]
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, "tune.json"), "w") as fh:
        json.dump({"figures": [f.as_dict() for f in figures], "load_average": loadavg()}, fh, indent=1, default=str)
    return figures


def main(argv: List[str] = None) -> int:
    from common import summary_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args(argv)
    print(summary_table(run(quick=args.quick, rounds=args.rounds)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
