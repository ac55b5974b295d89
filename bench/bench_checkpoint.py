"""Checkpoint figures (issue 3): save and restore of a ~100 MB state on 2 workers vs bare torch.save /
torch.load of the same state to the same disk, and how long an ``--async`` save blocks the notebook (the call and
a cell run at once after it, which waits for the save's copy of the state).

Run alone (``python bench/bench_checkpoint.py``) or from ``run_all.py``; returns :class:`Figure` rows.
"""
from __future__ import annotations

import os
import shutil
import sys
import tempfile
from typing import List

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import Figure, alternate, fmt_stats, section, single_thread, stats, summary_table, timed  # noqa: E402

SETUP = """
import torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
torch.set_num_threads(1)
torch.manual_seed(0)
model = prepare_model(torch.nn.Sequential(*[torch.nn.Linear(1024, 1024) for _ in range(12)]))  # ~50 MB
opt = torch.optim.Adam(model.parameters(), lr=1e-4)
loss = model(torch.randn(4, 1024)).pow(2).mean(); loss.backward(); opt.step()   # Adam state: ~100 MB more
"""
BARE = """
import os, time, torch
def _bare_save(path):
    t = time.perf_counter()
    torch.save({"model": model.module.state_dict(), "opt": opt.state_dict()}, path)
    return time.perf_counter() - t
def _bare_load(path):
    t = time.perf_counter()
    state = torch.load(path, weights_only=True)
    model.module.load_state_dict(state["model"]); opt.load_state_dict(state["opt"])
    return time.perf_counter() - t
"""


def run(rounds: int = 7) -> List[Figure]:
    single_thread()
    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal import cluster
    from raytrain_nb._internal.output import CollectSink

    cluster.connect()
    storage = tempfile.mkdtemp(prefix="rtnb-bench-ckpt-")
    g = WorkerGroup(2, cpus_per_worker=0.5, storage_path=storage, name="bench")
    try:
        quiet = CollectSink()
        g.run(SETUP, sink=quiet)
        g.run(BARE, sink=quiet)
        size_mb = float(g.run("sum(t.numel() * t.element_size() for t in list(model.module.state_dict().values()) "
                              "+ [v for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]) / 1e6",
                              sink=quiet).value)
        bare_path = os.path.join(storage, "bare.pt")
        n = {"i": 0}

        def ours_save() -> float:
            n["i"] += 1
            return timed(lambda: g.checkpoint(name=f"b{n['i']}"))

        def bare_save() -> float:  # rank 0 writes the replicated state in our layout too
            return float(g.run(f"_bare_save({bare_path!r})", ranks=[0], sink=quiet).value)

        # os.sync between runs: each save starts with no dirty pages left by the previous one
        saves = alternate({"ours": ours_save, "bare": bare_save}, rounds=rounds, between=os.sync)
        last = g.checkpoints("snapshot")[-1].name

        def ours_load() -> float:
            return timed(lambda: g.rollback(last))

        def bare_load() -> float:  # every rank needs the state back, as with a rollback
            return timed(lambda: g.run(f"_bare_load({bare_path!r})", sink=quiet))

        loads = alternate({"ours": ours_load, "bare": bare_load}, rounds=rounds)

        # Each mode is timed with a no-op cell run at once after it: an --async save returns before its copy is
        # taken (the copy is the workers' next call), so a cell that follows at once waits for the copy
        def blocking() -> float:
            n["i"] += 1
            return timed(lambda: g.checkpoint(name=f"s{n['i']}")) + timed(lambda: g.run("pass", sink=quiet))

        def background() -> float:
            n["i"] += 1
            took = timed(lambda: g.checkpoint(name=f"a{n['i']}", blocking=False))
            took += timed(lambda: g.run("pass", sink=quiet))
            g.checkpoints()  # wait for the write before the next round
            return took

        modes = alternate({"blocking": blocking, "async": background}, rounds=rounds, between=os.sync)
    finally:
        g.shutdown()
        shutil.rmtree(storage, ignore_errors=True)
    s_o, s_b = stats(saves["ours"]), stats(saves["bare"])
    l_o, l_b = stats(loads["ours"]), stats(loads["bare"])
    m_b, m_a = stats(modes["blocking"]), stats(modes["async"])
    section("checkpoint save/restore of the state on 2 workers vs bare torch.save/torch.load")
    print(f"state: {size_mb:.0f} MB (model + Adam)")
    print("save ours   ", fmt_stats(s_o, 1e3, "ms")); print("save bare   ", fmt_stats(s_b, 1e3, "ms"))
    print("load ours   ", fmt_stats(l_o, 1e3, "ms")); print("load bare   ", fmt_stats(l_b, 1e3, "ms"))
    print("blocking    ", fmt_stats(m_b, 1e3, "ms")); print("async call  ", fmt_stats(m_a, 1e3, "ms"))
    return [
        Figure("c1", f"snapshot save vs bare torch.save ({size_mb:.0f} MB)", s_o["median"] / s_b["median"], "x",
               "<", 1.3, spread=f"ours {s_o['median'] * 1e3:.0f} ms, bare {s_b['median'] * 1e3:.0f} ms"),
        Figure("c2", "rollback vs bare torch.load", l_o["median"] / l_b["median"], "x", "<", 1.3,
               spread=f"ours {l_o['median'] * 1e3:.0f} ms, bare {l_b['median'] * 1e3:.0f} ms"),
        Figure("c3", "--async save + the next cell, vs blocking save + the next cell", 100 * m_a["median"] / m_b["median"], "%",
               "<", 20.0, spread=f"async {m_a['median'] * 1e3:.0f} ms, blocking {m_b['median'] * 1e3:.0f} ms"),
    ]


if __name__ == "__main__":
    print(summary_table(run()))
