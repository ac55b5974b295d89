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

from common import pss_bytes, ray_session_pids, single_thread, stats  # noqa: E402
from workload import CHECK_STEP_CELL, GROUP_SETUP  # noqa: E402

SAMPLES = 5
MB = 1024 * 1024


def _tree(driver: int, session_dir: str) -> Dict[int, Dict[str, Any]]:
    procs = {driver: "driver"}
    procs.update(ray_session_pids(driver, session_dir))
    out = {}
    for pid, name in procs.items():
        pss = pss_bytes(pid)
        if pss is not None:
            out[pid] = {"name": name, "pss": pss}
    return out


def _alive_actors() -> List[Dict[str, Any]]:
    import ray

    try:
        from ray.util.state import list_actors

        return [{"id": a.actor_id, "class": a.class_name, "pid": a.pid}
                for a in list_actors(filters=[("state", "=", "ALIVE")], limit=1000, timeout=20)]
    except Exception as exc:  # noqa: BLE001 - the state API needs the dashboard; the GCS table does not
        print(f"  (ray.util.state.list_actors unavailable: {exc}; using the GCS actor table)")
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
    worker_pids = [s.info["pid"] for s in group._slots]
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
        by_name.setdefault(name, {"count": 0, "pss_mb": 0.0})
        by_name[name]["count"] += 1
        by_name[name]["pss_mb"] += p["pss"] / MB
    print(f"  session tree, idle, 2 workers with torch: {total / MB:.0f} MB PSS in {len(tree)} processes")
    for name, v in sorted(by_name.items(), key=lambda kv: -kv[1]["pss_mb"]):
        print(f"    {v['pss_mb']:7.1f} MB  {name}" + (f" (x{v['count']})" if v["count"] > 1 else ""))

    # One DDP step on the workers, then worker vs bare actor, alternated.
    group.run(GROUP_SETUP + CHECK_STEP_CELL, sink=CollectSink())

    @ray.remote(num_cpus=0)
    class Bare:
        def __init__(self) -> None:
            os.environ["OMP_NUM_THREADS"] = "1"
            import torch

            torch.set_num_threads(1)

        def pid(self) -> int:
            return os.getpid()

    bare = Bare.remote()
    bare_pid = ray.get(bare.pid.remote())
    time.sleep(1.0)
    actors = _alive_actors()
    worker_ids = {s.actor._actor_id.hex() for s in group._slots}
    helpers = [a for a in actors if a["id"] not in worker_ids and a["pid"] != bare_pid]
    w_samples: List[List[float]] = [[] for _ in worker_pids]
    b_samples: List[float] = []
    for _ in range(SAMPLES):
        for i, pid in enumerate(worker_pids):
            w_samples[i].append(pss_bytes(pid) / MB)
        b_samples.append(pss_bytes(bare_pid) / MB)
        time.sleep(0.2)
    bare_mb = stats(b_samples)["median"]
    workers_mb = [stats(s)["median"] for s in w_samples]
    for i, w in enumerate(workers_mb):
        print(f"  rank {i} after one DDP step: {w:.1f} MB PSS vs bare actor with torch {bare_mb:.1f} MB "
              f"({100 * (w / bare_mb - 1):+.1f}%)")
    print(f"  Ray actors alive besides the {len(worker_ids)} workers (and the bench's bare actor): "
          f"{len(helpers)} {[a['class'] for a in helpers]}")
    ray.kill(bare)
    group.shutdown()
    result = {
        "total_pss_mb": total / MB, "processes": len(tree), "by_name": by_name,
        "tree": {str(pid): {"name": p["name"], "pss_mb": p["pss"] / MB} for pid, p in tree.items()},
        "worker_pss_mb": workers_mb, "bare_pss_mb": bare_mb,
        "worker_over_bare": [w / bare_mb - 1 for w in workers_mb],
        "helper_actors": helpers, "all_alive_actors": len(actors), "wall_s": time.perf_counter() - t_start,
    }
    with open(out_path, "w") as fh:
        json.dump(result, fh, indent=1, default=str)
    ray.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
