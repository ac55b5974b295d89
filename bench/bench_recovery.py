"""Recovery figures (issue 4): time from SIGKILL of one of 2 workers to the first training step after
``restart`` (peer state), with ``--spares 1``, after ``restart --from-checkpoint``, a full rescale 2 -> 1 -> 2,
and, for comparison, what a user does today: shut the group down, start a fresh one, re-run the setup cell
and load the checkpoint. Also the training steps lost by a peer restart.

Each recovery is set beside its floor, measured in the same round with two bare Ray actors (no raytrain_nb):
a new actor that imports torch, then ``init_process_group`` (gloo) with a live peer on the group's size (the
floor of a restart); ``init_process_group`` alone (of a restart with a spare, whose torch is imported); the
peer alone at size 1 (of a shrink). Every step of each recovery's plan is timed (``group.last_recovery``),
so the table says where the seconds go.

Run alone (``python bench/bench_recovery.py``) or from ``run_all.py``; returns :class:`Figure` rows.
"""
from __future__ import annotations

import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from typing import Any, Dict, List

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import Figure, fmt_stats, median_ci, section, single_thread, stats, summary_table  # noqa: E402

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


def _free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _bare_actor_class():
    import ray

    @ray.remote(num_cpus=0.5)
    class Bare:
        """A plain Ray actor: what a worker costs without raytrain_nb."""

        def import_torch(self) -> int:
            import torch  # noqa: F401

            return os.getpid()

        def first_optimizer(self) -> float:
            """What any process pays at its first optimizer: torch imports torch._dynamo there (the setup cell's
            cost on a new rank, beyond importing torch)."""
            import torch

            t0 = time.perf_counter()
            torch.optim.SGD(torch.nn.Linear(2, 2).parameters(), lr=0.1)
            return time.perf_counter() - t0

        def init_pg(self, port: int, rank: int, world: int) -> bool:
            import datetime

            import torch.distributed as dist

            if dist.is_initialized():
                dist.destroy_process_group()
            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                                    timeout=datetime.timedelta(seconds=60))
            return True

    return Bare


def _floors() -> Dict[str, float]:
    """One round of the floors (seconds): ``restart`` (a new actor, torch imported, a process group of 2 with a
    live peer), ``spare`` (the process group of 2 again), ``shrink`` (the peer's process group of 1), and
    ``optimizer``: the new actor's first optimizer (torch imports torch._dynamo then), which the restart's replay
    of the setup cell pays and ``restart`` does not count."""
    import ray

    bare = _bare_actor_class()
    peer = bare.remote()
    new = None
    try:
        ray.get(peer.import_torch.remote(), timeout=120)
        t0 = time.perf_counter()
        new = bare.remote()
        ray.get(new.import_torch.remote(), timeout=120)
        port = _free_port()
        ray.get([peer.init_pg.remote(port, 0, 2), new.init_pg.remote(port, 1, 2)], timeout=120)
        restart = time.perf_counter() - t0
        optimizer = ray.get(new.first_optimizer.remote(), timeout=120)
        t0 = time.perf_counter()
        port = _free_port()
        ray.get([peer.init_pg.remote(port, 0, 2), new.init_pg.remote(port, 1, 2)], timeout=120)
        spare = time.perf_counter() - t0
        t0 = time.perf_counter()
        ray.get(peer.init_pg.remote(_free_port(), 0, 1), timeout=120)
        shrink = time.perf_counter() - t0
    finally:
        for actor in (peer, new):
            if actor is not None:
                ray.kill(actor, no_restart=True)
    return {"restart": restart, "spare": spare, "shrink": shrink, "optimizer": optimizer}


def _breakdown(label: str, timings: List[Any]) -> str:
    """The median seconds of each step of a recovery's plan, over the rounds."""
    names: List[str] = []
    for t in timings:
        names += [n for n, _ in t.steps if n not in names]
    parts = []
    for name in names:
        part = f"{name} {statistics.median(t.seconds(name) for t in timings):.2f}"
        if name == "Replay" and any(t.import_s for t in timings):
            part += f" (importing {statistics.median(t.import_s for t in timings):.2f})"
        parts.append(part)
    return f"  {label:28s} " + ", ".join(parts) + " s"


def run(rounds: int = 3) -> List[Figure]:
    single_thread()
    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal import cluster
    from raytrain_nb._internal.output import CollectSink

    cluster.connect()
    q = CollectSink()
    storage = tempfile.mkdtemp(prefix="rtnb-bench-recovery-")
    times: Dict[str, List[float]] = {k: [] for k in ("peer", "spare", "checkpoint", "rescale", "fresh")}
    floors: List[Dict[str, float]] = []
    plans: Dict[str, List[Any]] = {k: [] for k in ("peer", "spare", "shrink", "grow")}
    lost: List[int] = []

    def group(**kw):
        g = WorkerGroup(2, cpus_per_worker=0.5, storage_path=storage, **kw)
        g.run(SETUP, sink=q)
        for _ in range(3):
            g.run(STEP, sink=q)
        return g

    try:
        for _ in range(rounds):
            floors.append(_floors())
            g = group()
            g.checkpoint(name="ckpt")
            before = g.pull("step")
            t0 = _kill_rank1(g)
            g.restart()
            g.run(STEP, sink=q)
            times["peer"].append(time.perf_counter() - t0)
            plans["peer"].append(g.last_recovery)
            lost.append(before + 1 - g.pull("step", rank=1))

            t0 = _kill_rank1(g)
            g.restart(from_checkpoint="ckpt")
            g.run(STEP, sink=q)
            times["checkpoint"].append(time.perf_counter() - t0)

            t0 = time.perf_counter()
            g.rescale(1)
            plans["shrink"].append(g.last_recovery)
            g.run(STEP, sink=q)
            g.rescale(2)
            plans["grow"].append(g.last_recovery)
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
            plans["spare"].append(g.last_recovery)
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
    floor = {k: [f[k] for f in floors] for k in ("restart", "spare", "shrink", "optimizer")}
    for k, label in (("restart", "floor: new actor + torch + pg of 2"), ("spare", "floor: pg of 2 again"),
                     ("shrink", "floor: pg of 1"), ("optimizer", "a new process's first optimizer")):
        print(f"{label:38s}", fmt_stats(stats(floor[k]), 1, "s"))
    print("where the seconds go (median per step of the plan):")
    for k, label in (("peer", "restart (peer)"), ("spare", "restart, --spares 1"), ("shrink", "rescale 2 -> 1"),
                     ("grow", "rescale 1 -> 2")):
        print(_breakdown(label, plans[k]))
    # each round's recovery beside the floor measured in the same round
    over = {"peer": [t - f["restart"] for t, f in zip(times["peer"], floors)],
            "peer_setup": [t - f["restart"] - f["optimizer"] for t, f in zip(times["peer"], floors)],
            "spare": [t - f["spare"] for t, f in zip(times["spare"], floors)],
            "rescale": [t - f["shrink"] - f["restart"] for t, f in zip(times["rescale"], floors)],
            "rescale_setup": [t - f["shrink"] - f["restart"] - f["optimizer"]
                              for t, f in zip(times["rescale"], floors)]}
    ci = {k: median_ci(v) for k, v in over.items()}
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
        Figure("r7", "restart (peer) over its floor (bare actor + torch + pg)", statistics.median(over["peer"]), "s",
               "<", 1.0, spread=f"95% CI {ci['peer'][0]:.2f}-{ci['peer'][1]:.2f}; floor "
               f"{statistics.median(floor['restart']):.2f} s", note=_breakdown("", plans["peer"]).strip()),
        Figure("r7s", "restart (peer) over its floor + a new process's first optimizer",
               statistics.median(over["peer_setup"]), "s", "info", 1.0,
               spread=f"95% CI {ci['peer_setup'][0]:.2f}-{ci['peer_setup'][1]:.2f}; first optimizer "
               f"{statistics.median(floor['optimizer']):.2f} s",
               note="the replayed setup cell builds an optimizer: torch imports torch._dynamo there"),
        Figure("r8", "restart with a spare over its floor (pg of 2)", statistics.median(over["spare"]), "s", "<",
               0.5, spread=f"95% CI {ci['spare'][0]:.2f}-{ci['spare'][1]:.2f}; floor "
               f"{statistics.median(floor['spare']):.2f} s", note=_breakdown("", plans["spare"]).strip()),
        Figure("r9", "rescale 2 -> 1 -> 2 over its parts' floors", statistics.median(over["rescale"]), "s", "<", 1.0,
               spread=f"95% CI {ci['rescale'][0]:.2f}-{ci['rescale'][1]:.2f}; floors "
               f"{statistics.median(floor['shrink']):.2f} + {statistics.median(floor['restart']):.2f} s"),
        Figure("r9s", "rescale 2 -> 1 -> 2 over its parts' floors + a new process's first optimizer",
               statistics.median(over["rescale_setup"]), "s", "info", 1.0,
               spread=f"95% CI {ci['rescale_setup'][0]:.2f}-{ci['rescale_setup'][1]:.2f}",
               note="the new rank replays the setup cell, as a restart does"),
    ]


if __name__ == "__main__":
    print(summary_table(run()))
