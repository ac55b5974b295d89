"""Recovery figures (issue 4): time from SIGKILL of one of 2 workers to the first training step after
``restart`` (peer state), with ``--spares 1``, after ``restart --from-checkpoint``, a full rescale 2 -> 1 -> 2,
and, for comparison, what a user does today: shut the group down, start a fresh one, re-run the setup cell
and load the checkpoint. Also the training steps lost by a peer restart.

Run alone (``python bench/bench_recovery.py``) or from ``run_all.py``; returns :class:`Figure` rows.
"""
from __future__ import annotations

import os
import shutil
import signal
import sys
import tempfile
import time
from typing import Callable, Dict, List

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import Figure, fmt_stats, section, single_thread, stats, summary_table  # noqa: E402

SETUP = """
import torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model, prepare_data_loader
torch.set_num_threads(1)
torch.manual_seed(0)
model = prepare_model(torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10)))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
data = torch.utils.data.TensorDataset(torch.randn(2048, 64), torch.randint(0, 10, (2048,)))
loader = prepare_data_loader(torch.utils.data.DataLoader(data, batch_size=64, shuffle=True))
step = 0
"""
STEP = """
x, y = next(iter(loader))
loss = torch.nn.functional.cross_entropy(model(x), y)
opt.zero_grad(); loss.backward(); opt.step()
step += 1
"""


def _kill_rank1(g) -> float:
    pid = g.status()[1].pid
    t0 = time.perf_counter()
    os.kill(pid, signal.SIGKILL)
    while g.status()[1].state != "dead":
        pass
    return t0


def run(rounds: int = 3) -> List[Figure]:
    single_thread()
    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal import cluster
    from raytrain_nb._internal.output import CollectSink

    cluster.connect()
    q = CollectSink()
    storage = tempfile.mkdtemp(prefix="rtnb-bench-recovery-")
    times: Dict[str, List[float]] = {k: [] for k in ("peer", "spare", "checkpoint", "rescale", "fresh")}
    lost: List[int] = []

    def group(**kw):
        g = WorkerGroup(2, cpus_per_worker=0.5, storage_path=storage, **kw)
        g.run(SETUP, sink=q)
        for _ in range(3):
            g.run(STEP, sink=q)
        return g

    try:
        for _ in range(rounds):
            g = group()
            g.checkpoint(name="ckpt")
            before = g.pull("step")
            t0 = _kill_rank1(g)
            g.restart()
            g.run(STEP, sink=q)
            times["peer"].append(time.perf_counter() - t0)
            lost.append(before + 1 - g.pull("step", rank=1))

            t0 = _kill_rank1(g)
            g.restart(from_checkpoint="ckpt")
            g.run(STEP, sink=q)
            times["checkpoint"].append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            g.rescale(1)
            g.run(STEP, sink=q)
            g.rescale(2)
            g.run(STEP, sink=q)
            times["rescale"].append(time.perf_counter() - t0)
            name, url = g.name, g.run_storage.url

            t0 = _kill_rank1(g)  # today's alternative: start over and load the checkpoint
            g.shutdown()
            fresh = WorkerGroup(2, cpus_per_worker=0.5, storage_path=storage)
            fresh.run(SETUP, sink=q)
            fresh.rollback("ckpt", run=name)
            fresh.run(STEP, sink=q)
            times["fresh"].append(time.perf_counter() - t0)
            fresh.shutdown()

            g = group(spares=1)
            g._core.collect([s.actor.warm.remote() for s in g._core.slots.spares], 120, "start")  # spares warm
            t0 = _kill_rank1(g)
            g.restart()
            g.run(STEP, sink=q)
            times["spare"].append(time.perf_counter() - t0)
            g.shutdown()
    finally:
        shutil.rmtree(storage, ignore_errors=True)
    st = {k: stats(v) for k, v in times.items()}
    section("recovery after SIGKILL of one of 2 workers (to the first training step)")
    for k, label in (("peer", "restart (peer)"), ("spare", "restart, --spares 1"), ("checkpoint",
                     "restart --from-checkpoint"), ("rescale", "rescale 2->1->2 (+2 steps)"),
                     ("fresh", "shutdown + new group + setup + load")):
        print(f"{label:38s}", fmt_stats(st[k], 1, "s"))
    print("steps lost by a peer restart:", lost)
    return [
        Figure("r1", "SIGKILL -> first step after restart (peer state)", st["peer"]["median"], "s", "<", 5.0,
               spread=f"fresh group + setup + load: {st['fresh']['median']:.1f} s"),
        Figure("r2", "SIGKILL -> first step after restart, --spares 1", st["spare"]["median"], "s", "<", 2.0),
        Figure("r3", "SIGKILL -> first step after restart --from-checkpoint", st["checkpoint"]["median"], "s",
               "info", 5.0),
        Figure("r4", "rescale 2 -> 1 -> 2 (with a step after each)", st["rescale"]["median"], "s", "info", 5.0),
        Figure("r5", "today's alternative: shutdown, new group, setup, load", st["fresh"]["median"], "s", "info",
               5.0, note="Ray Train here: ~19 s to the first step after a crash"),
        Figure("r6", "training steps lost by a peer restart (max)", float(max(lost)), "", "<", 2,
               note="at most one step may be lost"),
    ]


if __name__ == "__main__":
    print(summary_table(run()))
