"""Several Ray nodes on one machine (ray.cluster_utils.Cluster), in a subprocess apart from the shared instance:
SPREAD placement, a lost node noticed, its rank restarted on the free node, then a rescale."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import json, os, signal, threading, time
    import ray
    from ray.cluster_utils import Cluster
    # Ray declares a lost node dead after 10 missed health checks of 0.5 s: the loss (its worker killed
    # with it) is noticed well before that, so the restart below starts while the node still looks alive
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 0, "object_store_memory": 80 * 1024 * 1024,
        "_system_config": {"health_check_period_ms": 500, "health_check_failure_threshold": 10,
                           "health_check_initial_delay_ms": 0}})
    nodes = [cluster.add_node(num_cpus=1, object_store_memory=80 * 1024 * 1024) for _ in range(3)]
    ray.init(address=cluster.address, log_to_driver=False)
    from raytrain_nb import WorkerGroup, WorkerError
    from raytrain_nb._internal.output import CollectSink
    out = {}
    g = WorkerGroup(2, placement_strategy="SPREAD", heartbeat_timeout_s=60)
    g.run("import os, torch, raytrain_nb as train\\nfrom raytrain_nb.torch import prepare_model\\n"
          "torch.manual_seed(0)\\nctx = train.get_context()\\nmodel = prepare_model(torch.nn.Linear(4, 1))\\n"
          "opt = torch.optim.SGD(model.parameters(), lr=0.1)\\nstep = 0", sink=CollectSink())
    out["node_ranks"] = g.execute(lambda: __import__("raytrain_nb").get_context().get_node_rank())
    out["nodes"] = [r.node for r in g.status()]
    out["node_ids"] = [s.info["node_id"] for s in g.slots]
    out["pids"] = [s.info["pid"] for s in g.slots]
    victim = next(n for n in nodes if n.node_id == out["node_ids"][1])

    class Sink(CollectSink):
        seen = threading.Event()
        def stream(self, rank, name, text, label):
            super().stream(rank, name, text, label)
            self.seen.set()

    sink = Sink()
    def remove():
        sink.seen.wait(60)
        out["removed_at"] = time.monotonic()
        cluster.remove_node(victim, allow_graceful=False)
        # A lost machine takes its processes with it; here only the node's raylet is killed and its worker
        # would live on for a while: end it as the machine would (then the loss is noticed at once, before
        # Ray's health checks declare the node dead)
        os.kill(out["pids"][1], signal.SIGKILL)
    threading.Thread(target=remove, daemon=True).start()
    try:
        g.run("print('go', flush=True)\\nwhile True:\\n    loss = model(torch.randn(8, 4)).pow(2).mean()\\n"
              "    opt.zero_grad(); loss.backward(); opt.step(); step += 1", sink=sink)
    except WorkerError as exc:
        out["detected_after_s"] = time.monotonic() - out["removed_at"]
        out["error"] = str(exc)
    # the lost node's place moves to the free third node: a restart waits for Ray to record the death
    # (until then the lost node's bundle still looks placed) and starts the new rank 1 there
    g.restart()
    out["restarted_node"] = g.slots[1].info["node_id"]
    out["victim_node"] = victim.node_id
    out["spare_node"] = next(n.node_id for n in nodes if n.node_id not in out["node_ids"])
    out["after_restart"] = g.run("loss = model(torch.randn(8, 4)).pow(2).mean()\\nloss.backward()\\n"
                                 "train.get_context().get_world_size()", sink=CollectSink()).value
    g.rescale(1)
    g.run("for _ in range(3):\\n    loss = model(torch.randn(8, 4)).pow(2).mean()\\n"
          "    opt.zero_grad(); loss.backward(); opt.step(); step += 1", sink=CollectSink())
    out["after"] = g.run("(ctx.get_world_size() if False else train.get_context().get_world_size(), step > 3)",
                         sink=CollectSink()).value
    g.shutdown()
    print("RESULT " + json.dumps(out))
    ray.shutdown()
    cluster.shutdown()
""")


@pytest.mark.scripts
def test_spread_over_nodes_a_lost_node_restarted_elsewhere_then_rescale(tmp_path):
    env = {**os.environ, "RAYTRAIN_NB_STORAGE_PATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=400, env=env)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, proc.stderr[-4000:]
    out = json.loads(line[7:])
    assert sorted(out["node_ranks"]) == [0, 1] and len(set(out["node_ids"])) == 2
    assert "[rank 1] WorkerDiedError" in out["error"] and "node" in out["error"]
    assert out["detected_after_s"] < 30
    assert out["restarted_node"] == out["spare_node"] != out["victim_node"] and out["after_restart"] == "2"
    assert out["after"] == "(1, True)"
