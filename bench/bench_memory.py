"""Figure 5: memory, as PSS, of a fresh session with 2 idle workers; worker vs bare Ray actor.

Runs as its own process (``run_all.py`` starts it) so that the driver is as light as a notebook
kernel's and Ray is sized as a user gets it (no ``RAYTRAIN_NB_NUM_CPUS`` override): the driver,
every process of the Ray instance it started (descendants of the driver, plus any process naming
the session directory: gcs, raylet, agents, monitors, idle pooled workers) and the 2 workers,
which imported torch when they joined the gloo group.

Then one DDP step runs on the workers and each worker's PSS is compared with a bare Ray actor
that only imported torch; samples alternate worker, bare, worker, bare. Last, the Ray actors
alive besides the workers are counted (a design goal: no helper actors).
"""
from __future__ import annotations

import json
import os
import sys
import time
from typing import Any, Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from common import pss_bytes, pss_parts, ray_session_pids, single_thread, stats  # noqa: E402
from workload import BASELINE_SETUP, CHECK_STEP_CELL, GROUP_SETUP  # noqa: E402

SAMPLES = 5
MB = 1024 * 1024


def _tree(driver: int, session_dir: str) -> Dict[int, Dict[str, Any]]:
    procs = {driver: "driver"}
    procs.update(ray_session_pids(driver, session_dir))
    out = {}
    for pid, name in procs.items():
        parts = pss_parts(pid)
        if parts.get("Pss") is not None:
            out[pid] = {"name": name, "pss": parts["Pss"], "anon": parts.get("Pss_Anon", 0)}
    return out


def _alive_actors() -> List[Dict[str, Any]]:
    import ray

    try:
        from ray.util.state import list_actors

        address = ray._private.worker._global_node.address  # this session's GCS (others may run here)
        return [{"id": a.actor_id, "class": a.class_name, "pid": a.pid}
                for a in list_actors(address=address, filters=[("state", "=", "ALIVE")], limit=1000, timeout=20)]
    except Exception as exc:  # noqa: BLE001 - the state API needs the dashboard; the GCS table does not
        print(f"  (ray.util.state.list_actors unavailable: {str(exc).splitlines()[0][:90]}...; "
              "counting from the GCS actor table)")
        return [{"id": aid, "class": a.get("ActorClassName"), "pid": a.get("Pid")}
                for aid, a in ray._private.state.actors().items() if a.get("State") == "ALIVE"]


def main(out_path: str) -> None:
    single_thread()
    t_start = time.perf_counter()
    import ray

    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal import cluster
    from raytrain_nb._internal.output import CollectSink

    cluster.connect()
    session_dir = ray._private.worker._global_node.get_session_dir_path()
    group = WorkerGroup(2)
    worker_pids = [s.info["pid"] for s in group.slots]
    group.run("import torch\ntorch.set_num_threads(1)\nimported = 'torch' in __import__('sys').modules",
              sink=CollectSink())
    assert group.pull("imported", rank=None) == [True, True]
    time.sleep(2.0)  # let start-up garbage settle (prestarted workers, agents)

    tree = _tree(os.getpid(), session_dir)
    assert all(p in tree for p in worker_pids), "the workers are not in the measured tree"
    total = sum(p["pss"] for p in tree.values())
    by_name: Dict[str, Dict[str, float]] = {}
    for pid, p in sorted(tree.items(), key=lambda kv: -kv[1]["pss"]):
        name = "worker (rank %d)" % worker_pids.index(pid) if pid in worker_pids else p["name"]
        by_name.setdefault(name, {"count": 0, "pss_mb": 0.0, "anon_mb": 0.0})
        by_name[name]["count"] += 1
        by_name[name]["pss_mb"] += p["pss"] / MB
        by_name[name]["anon_mb"] += p["anon"] / MB
    anon_total = sum(p["anon"] for p in tree.values())
    print(f"  session tree, idle, 2 workers with torch: {total / MB:.0f} MB PSS in {len(tree)} processes "
          f"({anon_total / MB:.0f} MB of it anonymous; the rest is library pages, split with every process on "
          "the machine that maps them)")
    for name, v in sorted(by_name.items(), key=lambda kv: -kv[1]["pss_mb"]):
        print(f"    {v['pss_mb']:7.1f} MB (anon {v['anon_mb']:5.1f})  {name}"
              + (f" (x{v['count']})" if v["count"] > 1 else ""))

    # One DDP step on the workers; then each worker vs a bare actor that only imported torch, and
    # vs a pair of bare actors that ran the same DDP step with plain torch.distributed (no raytrain_nb).
    group.run(GROUP_SETUP + CHECK_STEP_CELL, sink=CollectSink())

    @ray.remote(num_cpus=0)
    class Bare:
        def __init__(self) -> None:
            os.environ["OMP_NUM_THREADS"] = "1"
            import torch

            torch.set_num_threads(1)

        def pid(self) -> int:
            return os.getpid()

        def ddp_step(self, rank: int, port: int, setup: str, step: str) -> float:
            import torch.distributed as dist

            dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
            self.ns = {"__name__": "__main__", "rank": rank}
            exec(compile(setup, "<setup>", "exec"), self.ns)
            exec(compile(step, "<step>", "exec"), self.ns)
            return self.ns["checksum"]

    from raytrain_nb._internal.backend import free_port

    bare = Bare.remote()
    ref_pair = [Bare.remote(), Bare.remote()]
    pids = ray.get([a.pid.remote() for a in [bare, *ref_pair]])
    bare_pid, ref_pids = pids[0], pids[1:]
    port = free_port()
    ray.get([a.ddp_step.remote(r, port, BASELINE_SETUP, CHECK_STEP_CELL) for r, a in enumerate(ref_pair)])
    time.sleep(1.0)
    tree_after = _tree(os.getpid(), session_dir)
    total_after = sum(p["pss"] for pid, p in tree_after.items() if pid not in pids)
    print(f"  session tree after one DDP step (bench's bare actors excluded): {total_after / MB:.0f} MB PSS")
    actors = _alive_actors()
    worker_ids = {s.actor._actor_id.hex() for s in group.slots}
    helpers = [a for a in actors if a["id"] not in worker_ids and a["pid"] not in pids]
    w_samples: List[List[float]] = [[] for _ in worker_pids]
    b_samples: List[float] = []
    r_samples: List[List[float]] = [[] for _ in ref_pids]
    for _ in range(SAMPLES):  # alternate: workers, bare, reference pair, workers, ...
        for i, pid in enumerate(worker_pids):
            w_samples[i].append(pss_bytes(pid) / MB)
        b_samples.append(pss_bytes(bare_pid) / MB)
        for i, pid in enumerate(ref_pids):
            r_samples[i].append(pss_bytes(pid) / MB)
        time.sleep(0.2)
    bare_mb = stats(b_samples)["median"]
    ref_mb = stats([stats(s)["median"] for s in r_samples])["median"]
    workers_mb = [stats(s)["median"] for s in w_samples]
    anon = {name: pss_parts(pid).get("Pss_Anon", 0) / MB
            for name, pid in (("rank 0", worker_pids[0]), ("bare", bare_pid), ("bare+DDP", ref_pids[0]))}
    print("  of which anonymous (heap, independent of library sharing): "
          + ", ".join(f"{k} {v:.0f} MB" for k, v in anon.items()))
    for i, w in enumerate(workers_mb):
        print(f"  rank {i} after one DDP step: {w:.1f} MB PSS; bare actor with torch {bare_mb:.1f} MB "
              f"({100 * (w / bare_mb - 1):+.1f}%); bare actor after the same DDP step {ref_mb:.1f} MB "
              f"({100 * (w / ref_mb - 1):+.1f}%)")
    print(f"  Ray actors alive besides the {len(worker_ids)} workers (and the bench's own bare actors): "
          f"{len(helpers)} {[a['class'] for a in helpers]}")
    for a in [bare, *ref_pair]:
        ray.kill(a)
    group.shutdown()
    result = {
        "total_pss_mb": total / MB, "total_anon_mb": anon_total / MB, "processes": len(tree), "by_name": by_name,
        "tree": {str(pid): {"name": p["name"], "pss_mb": p["pss"] / MB, "anon_mb": p["anon"] / MB}
                 for pid, p in tree.items()},
        "total_after_step_pss_mb": total_after / MB,
        "worker_pss_mb": workers_mb, "bare_pss_mb": bare_mb, "bare_ddp_pss_mb": ref_mb, "pss_anon_mb": anon,
        "worker_over_bare": [w / bare_mb - 1 for w in workers_mb],
        "worker_over_bare_ddp": [w / ref_mb - 1 for w in workers_mb],
        "helper_actors": helpers, "all_alive_actors": len(actors), "wall_s": time.perf_counter() - t_start,
    }
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
