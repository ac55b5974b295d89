"""XGBoost, LightGBM and TensorFlow through raytrain_nb vs Ray Train's own trainers, in one run (section 16).

Per library (2 workers, each its own generated shard of ``ROWS`` rows x 16 features, ``ROUNDS`` boosting rounds
or ``EPOCHS`` epochs of a small Keras model under ``MultiWorkerMirroredStrategy``, one thread per worker):

- ``fit()`` wall time of raytrain_nb's ``XGBoostTrainer`` / ``LightGBMTrainer`` vs Ray Train's (the same training
  function, only the imports differ), run interleaved (ours, Ray's, ours, ...); the median of the per-pair ratios
  ours/Ray's with its 95 % bootstrap interval;
- the time from submitting a training cell to its first boosting round on a warm ``backend=...`` group (the
  second cell), against the same from calling a fresh raytrain_nb trainer's ``fit()``. TensorFlow's first step
  includes making the strategy and the model, which a training cell does again on a warm group.

Usage: ``.venv/bin/python bench/bench_xgboost.py [--quick] [--only tensorflow ...]``; ``bench/run_all.py --only 16``.
"""
from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Sequence

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYTRAIN_NB_NUM_CPUS", "6")  # the workers, Ray Train's controller, headroom
# Ray Train's workers load Keras before the training function runs: the legacy Keras 2 (Keras 3 fails under the
# strategy) must be chosen before Ray starts, so that its workers inherit it; raytrain_nb's backend sets it itself.
os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(BENCH_DIR)
for _p in (REPO_DIR, BENCH_DIR):
    if _p not in sys.path:
        sys.path.insert(0, _p)

from common import Figure, alternate, fmt_stats, loadavg, median_ci, section, stats  # noqa: E402

WORLD = 2
ROWS = 20_000
ROUNDS = 30
EPOCHS = 3
PAIRS = 3


def _shard(rank: int) -> Any:
    import numpy as np

    x = np.random.default_rng(rank).normal(size=(ROWS, 16))
    return x, x @ np.linspace(-1.0, 1.0, 16) + 0.1 * np.random.default_rng(100 + rank).normal(size=ROWS)


def xgb_loop(config: Dict[str, Any]) -> None:
    """The training function both trainers run (``config["api"]`` names the package to report through)."""
    import importlib

    import xgboost

    train = importlib.import_module(config["api"])
    x, y = _shard(train.get_context().get_world_rank())
    first: List[float] = []

    class First(xgboost.callback.TrainingCallback):
        def after_iteration(self, model: Any, epoch: int, log: Any) -> bool:
            first.append(first[0] if first else time.time())
            return False

    t0 = time.perf_counter()
    xgboost.train({"tree_method": "hist", "max_depth": 6, "nthread": 1}, xgboost.DMatrix(x, label=y),
                  num_boost_round=config["rounds"], callbacks=[First()])
    _report(train, {"train_s": time.perf_counter() - t0, "t_first": first[0]})


def lgb_loop(config: Dict[str, Any]) -> None:
    import importlib

    import lightgbm

    train = importlib.import_module(config["api"])
    network = importlib.import_module(config["api"] + ".lightgbm").get_network_params()
    x, y = _shard(train.get_context().get_world_rank())
    first: List[float] = []

    def callback(env: Any) -> None:
        first.append(first[0] if first else time.time())

    t0 = time.perf_counter()
    lightgbm.train({"objective": "regression", "tree_learner": "data_parallel", "pre_partition": True,
                    "num_threads": 1, "verbose": -1, **network}, lightgbm.Dataset(x, label=y),
                   num_boost_round=config["rounds"], callbacks=[callback])
    _report(train, {"train_s": time.perf_counter() - t0, "t_first": first[0]})


def tf_loop(config: Dict[str, Any]) -> None:
    import importlib

    import tensorflow as tf

    train = importlib.import_module(config["api"])
    first: List[float] = []

    class First(tf.keras.callbacks.Callback):
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            first.append(first[0] if first else time.time())

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    x, y = _shard(train.get_context().get_world_rank())
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(64, activation="relu", input_shape=(16,)),
                                     tf.keras.layers.Dense(1)])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    data = tf.data.Dataset.from_tensor_slices((x.astype("float32"), y.astype("float32"))).batch(256)
    t0 = time.perf_counter()
    model.fit(data.with_options(options), epochs=config["rounds"], verbose=0, callbacks=[First()])
    _report(train, {"train_s": time.perf_counter() - t0, "t_first": first[0]})


def _report(train: Any, metrics: Dict[str, float]) -> None:
    """Every rank reports; rank 0 with a checkpoint (Ray Train's ``Result.metrics`` are the checkpoint's)."""
    with tempfile.TemporaryDirectory() as d:
        open(os.path.join(d, "done"), "w").close()
        rank0 = train.get_context().get_world_rank() == 0
        train.report(metrics, checkpoint=train.Checkpoint.from_directory(d) if rank0 else None)


#: library -> (training function, trainer class, rounds or epochs, figure keys: fit ratio, warm first step)
LIBRARIES = {"xgboost": (xgb_loop, "XGBoostTrainer", ROUNDS, "16a", "16b"),
             "lightgbm": (lgb_loop, "LightGBMTrainer", ROUNDS, "16c", "16d"),
             "tensorflow": (tf_loop, "TensorflowTrainer", EPOCHS, "16e", "16f")}


def _fit(api: str, library: str, storage: str) -> Dict[str, float]:
    import importlib

    loop, cls, rounds = LIBRARIES[library][:3]
    base = importlib.import_module(api)
    trainer_cls = getattr(importlib.import_module(f"{api}.{library}"), cls)
    run_config = base.RunConfig(storage_path=storage, name=f"bench-{time.time_ns()}",
                                **({"verbose": 0} if api == "raytrain_nb" else {}))
    trainer = trainer_cls(loop, train_loop_config={"api": api, "rounds": rounds},
                          scaling_config=base.ScalingConfig(num_workers=WORLD), run_config=run_config)
    t_call = time.time()
    started = time.perf_counter()
    result = trainer.fit()
    return {"wall_s": time.perf_counter() - started, "first_round_s": result.metrics["t_first"] - t_call,
            "train_s": result.metrics["train_s"]}


def _warm_cell(library: str) -> float:
    """Seconds from submitting a training cell to its first step, on a warm group (the second cell)."""
    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal.output import CollectSink

    loop, rounds = LIBRARIES[library][0].__name__, LIBRARIES[library][2]
    group = WorkerGroup(WORLD, backend=library)
    try:
        group.push(**{loop: LIBRARIES[library][0]})
        group.run(f"import raytrain_nb\n{loop}({{'api': 'raytrain_nb', 'rounds': 1}})", sink=CollectSink())  # warm
        t_call = time.time()
        group.run(f"{loop}({{'api': 'raytrain_nb', 'rounds': {rounds}}})", sink=CollectSink())
        return group.latest_metrics[0]["t_first"] - t_call
    finally:
        group.shutdown()


def _one_library(library: str, pairs: int, storage: str) -> List[Figure]:
    variants: Dict[str, Callable[[], Any]] = {"raytrain_nb": lambda: _fit("raytrain_nb", library, storage),
                                              "ray.train": lambda: _fit("ray.train", library, storage)}
    samples = alternate(variants, rounds=pairs, warmup=1)
    for name, runs in samples.items():
        print(f"  {library} {name:12s} fit {fmt_stats(stats([r['wall_s'] for r in runs]), unit='s')}; "
              f"training {fmt_stats(stats([r['train_s'] for r in runs]), unit='s')}")
    ratios = [a["wall_s"] / b["wall_s"] for a, b in zip(samples["raytrain_nb"], samples["ray.train"])]
    r, (lo, hi) = stats(ratios), median_ci(ratios)
    print(f"  {library} fit ratio raytrain_nb/ray.train: {fmt_stats(r, digits=3)}; 95% CI {lo:.3f}-{hi:.3f}; "
          f"load {loadavg()}")
    warm = _warm_cell(library)
    fresh = stats([s["first_round_s"] for s in samples["raytrain_nb"]])
    print(f"  {library} first step: warm cell {warm:.2f} s; fresh trainer {fmt_stats(fresh, unit='s')}")
    key, key_warm = LIBRARIES[library][3:]
    return [
        Figure(key, f"{library} fit() wall: raytrain_nb / Ray Train (median ratio)", r["median"], "x", "<", 1.0,
               spread=f"95% CI {lo:.3f}-{hi:.3f}, n={r['n']}", detail={"ratios": ratios, "samples": samples}),
        Figure(key_warm, f"{library} first step: warm cell / fresh trainer", warm / fresh["median"], "x", "<", 1.0,
               spread=f"warm {warm:.2f} s vs fresh {fresh['median']:.2f} s", detail={"warm_s": warm, "fresh": fresh}),
    ]


def run(quick: bool = False, only: Sequence[str] = ()) -> List[Figure]:
    import ray.cloudpickle  # Ray pickles with its own copy of cloudpickle: the registration must be there

    from raytrain_nb._internal import cluster

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the workers cannot import bench/ by name
    pairs = 1 if quick else PAIRS
    section(f"16. XGBoost / LightGBM / TensorFlow: raytrain_nb vs Ray Train trainers ({WORLD} workers, {ROWS} rows "
            f"x 16 each, {ROUNDS} rounds or {EPOCHS} epochs; {pairs} interleaved pair(s) after one warm-up pair)")
    cluster.connect()
    storage = tempfile.mkdtemp(prefix="bench-boosting-")
    figures: List[Figure] = []
    for library in only or LIBRARIES:
        try:
            figures += _one_library(library, pairs, storage)
        except Exception as exc:  # noqa: BLE001 - one library that cannot run keeps none of the others' figures out
            why = f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[-1][:200]}"
            print(f"  ERROR in {library}: {why}", flush=True)
            figures += [Figure(key, f"{library}: could not run", None, "x", "<", 1.0, note=why)
                        for key in LIBRARIES[library][3:]]
    return figures


if __name__ == "__main__":
    import argparse

    from common import single_thread, summary_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", nargs="*", choices=sorted(LIBRARIES), default=())
    args = parser.parse_args()
    single_thread()
    print(summary_table(run(quick=args.quick, only=args.only)))
