"""Warm sweep figures (issue 16, part 3): a trained group's snapshot starts every Tune trial; the winner loads back.

On a ~17 MB model (+ ~34 MB of Adam state) on a 2-worker group: how long making the snapshot every trial starts
from takes, how long a warm trial takes from the sweep's start to its first step (loaded state included) and how
much of that is ``load_state``, the whole sweep, and ``group.load`` of the winner against ``group.rollback`` of the group's own snapshot (the same
files and the same worker code: the figure says the by-name path adds nothing).

Run alone (``python bench/bench_tune_warm.py``) or from ``run_all.py`` (section 12); returns :class:`Figure` rows.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any, Dict, List

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import Figure, alternate, fmt_stats, section, single_thread, stats, summary_table, timed  # noqa: E402

LAYERS, WIDTH = 4, 1024
SETUP = f"""
import torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
torch.set_num_threads(1)
torch.manual_seed(0)
model = prepare_model(torch.nn.Sequential(*[torch.nn.Linear({WIDTH}, {WIDTH}) for _ in range({LAYERS})]))
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
for _ in range(3):
    loss = model(torch.randn(8, {WIDTH})).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
"""


def _finetune(config: Dict[str, Any]) -> None:
    """A trial's training function: warm state by name, the trial's lr, 3 steps, one report with a checkpoint."""
    import torch

    import raytrain_nb as train
    from raytrain_nb.torch import prepare_model
    from raytrain_nb.tune import load_state, save_state

    torch.set_num_threads(1)
    model = prepare_model(torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)]))
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    t0 = time.perf_counter()
    load_state(train.get_checkpoint(), model=model, opt=opt)
    load_s = time.perf_counter() - t0
    first_step = time.time()
    for group in opt.param_groups:
        group["lr"] = config["lr"]
    for _ in range(3):
        loss = model(torch.randn(8, WIDTH)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    with tempfile.TemporaryDirectory() as tmp:
        train.report({"loss": loss.item(), "first_step": first_step, "load_s": load_s}, checkpoint=save_state(tmp, model=model, opt=opt))


def _trial(config: Dict[str, Any], warm: Any = None, storage: str = "") -> None:
    from raytrain_nb import RunConfig, ScalingConfig
    from raytrain_nb.torch import TorchTrainer
    from raytrain_nb.tune import TuneReportCallback

    TorchTrainer(_finetune, train_loop_config=config, resume_from_checkpoint=warm,
                 scaling_config=ScalingConfig(num_workers=1),
                 run_config=RunConfig(storage_path=storage, callbacks=[TuneReportCallback()])).fit()


def run(quick: bool = False) -> List[Figure]:
    single_thread()
    import ray.cloudpickle
    from ray import tune

    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal import cluster
    from raytrain_nb._internal.output import CollectSink
    from raytrain_nb.tune import warm_start

    section("12. warm sweep: snapshot -> every Tune trial starts from it -> the winner loads back into the group")
    if __name__ != "__main__":
        ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # trials need not import bench/
    cluster.connect()
    storage = tempfile.mkdtemp(prefix="rtnb-bench-warm-")
    g = WorkerGroup(2, cpus_per_worker=0.5, storage_path=storage, name="bench-warm")
    try:
        quiet = CollectSink()
        g.run(SETUP, sink=quiet)
        t_snap = timed(lambda: g.checkpoint("warm"))
        warm = warm_start(g, "warm")
        lrs = [1e-4, 3e-4] if quick else [1e-4, 3e-4, 1e-3]
        tuner = tune.Tuner(
            tune.with_resources(tune.with_parameters(_trial, warm=warm, storage=os.path.join(storage, "trials")),
                                {"cpu": 0.1}),
            param_space={"lr": tune.grid_search(lrs)},
            tune_config=tune.TuneConfig(metric="loss", mode="min", max_concurrent_trials=2),
            run_config=tune.RunConfig(name="bench-warm", storage_path=os.path.join(storage, "tune"), verbose=0))
        started = time.time()
        results = tuner.fit()
        sweep_s = time.time() - started
        if results.errors:
            raise RuntimeError(f"the warm sweep failed: {results.errors[0]}")
        first = [r.metrics["first_step"] - started for r in results]
        load_in_trial = [r.metrics["load_s"] for r in results]
        best = results.get_best_result()
        loads = alternate({"load": lambda: timed(lambda: g.load(best)),
                           "rollback": lambda: timed(lambda: g.rollback("warm"))}, rounds=2 if quick else 5)
        ratio = stats(loads["load"])["median"] / stats(loads["rollback"])["median"]
        print(f"  snapshot {t_snap:.2f} s; sweep of {len(lrs)} trials (2 at once) {sweep_s:.1f} s; first step after "
              f"{fmt_stats(stats(first), unit='s')}")
        print(f"  group.load(winner) {fmt_stats(stats(loads['load']), unit='s')}; "
              f"rollback {fmt_stats(stats(loads['rollback']), unit='s')}")
        return [
            Figure("12a", "warm sweep: snapshot the trials start from", t_snap, "s", "info", 0.0),
            Figure("12b", "warm trial: sweep start -> first step (state loaded)", stats(first)["median"], "s",
                   "info", 0.0, spread=fmt_stats(stats(first), unit="s")),
            Figure("12b'", "warm trial: load_state of the snapshot (model + Adam state)",
                   stats(load_in_trial)["median"], "s", "info", 0.0, spread=fmt_stats(stats(load_in_trial), unit="s")),
            Figure("12c", f"warm sweep of {len(lrs)} trials, 1 worker each, 2 at once", sweep_s, "s", "info", 0.0),
            Figure("12d", "group.load(winner) / rollback of the same-size snapshot", ratio, "x", "<", 1.5,
                   spread=f"load {fmt_stats(stats(loads['load']), unit='s')}",
                   note=f"rollback {fmt_stats(stats(loads['rollback']), unit='s')}"),
        ]
    finally:
        g.shutdown()


if __name__ == "__main__":
    os.environ.setdefault("RAYTRAIN_NB_NUM_CPUS", "4")  # as run_all.py sets it
    figures = run(quick="--quick" in sys.argv)
    print(summary_table(figures))
