"""Elastic training on a two-node Ray cluster (ray.cluster_utils, in a subprocess apart from the shared instance).

The node of rank 1 is removed after a report: its placement cannot be satisfied any more, so the run
continues with one worker from the newest checkpoint; a node is then added back and the run grows
to two workers again, resuming from the newest checkpoint once more.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent("""
    import asyncio, json, os, signal, sys, tempfile, time
    os.environ["RAYTRAIN_NB_ELASTIC_WAIT_S"] = "3"
    import ray
    from ray.cluster_utils import Cluster
    small = {"object_store_memory": 80 * 1024 * 1024}

    def retried(start, what):
        # a loaded machine sometimes misses Ray's 15 s node start-up deadline: try again, as cluster.connect does
        for attempt in range(3):
            try:
                return start()
            except Exception as exc:
                if "timed out" not in str(exc).lower() or attempt == 2:
                    raise
                print(f"{what}: {exc}; retrying", file=sys.stderr, flush=True)

    cluster = Cluster()
    retried(lambda: cluster.add_node(num_cpus=1, **small, _system_config={
        "health_check_period_ms": 500, "health_check_failure_threshold": 4, "health_check_initial_delay_ms": 0}),
        "head node")
    second = retried(lambda: cluster.add_node(num_cpus=1, **small), "second node")
    ray.init(address=cluster.address, log_to_driver=False)

    import torch
    import raytrain_nb as train
    from raytrain_nb import Checkpoint, FailureConfig, RunConfig, ScalingConfig, UserCallback
    from raytrain_nb.torch import TorchTrainer, prepare_model

    @ray.remote(num_cpus=0)
    class Gate:
        # named events: a worker waits at a point of the run until the driver has changed the cluster
        def __init__(self):
            self.events = {}
        def _event(self, name):
            return self.events.setdefault(name, asyncio.Event())
        async def wait(self, name):
            await self._event(name).wait()
        async def open(self, name):
            self._event(name).set()

    gate = Gate.options(name="gate").remote()

    def loop(config):
        model = torch.nn.Linear(4, 1)
        start = 0
        ckpt = train.get_checkpoint()
        if ckpt:
            with ckpt.as_directory() as d:
                state = torch.load(os.path.join(d, "s.pt"), weights_only=True)
            model.load_state_dict(state["model"]); start = state["step"] + 1
        ddp = prepare_model(model)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        ctx = train.get_context()
        rank, world = ctx.get_world_rank(), ctx.get_world_size()
        for step in range(start, config["steps"]):
            loss = ddp(torch.randn(8, 4)).pow(2).mean()
            opt.zero_grad(); loss.backward(); opt.step()
            with tempfile.TemporaryDirectory() as d:
                if rank == 0:
                    torch.save({"model": model.state_dict(), "step": step}, os.path.join(d, "s.pt"))
                train.report({"step": step, "world_size": world, "start": start, "pid": os.getpid()},
                             checkpoint=Checkpoint.from_directory(d) if rank == 0 else None)
            if world == 2 and start == 0 and step == 2:
                ray.get(ray.get_actor("gate").wait.remote("removed"))  # the driver removes rank 1's node
            if world == 1:
                if step == start:
                    ray.get(ray.get_actor("gate").wait.remote("added"))  # the driver adds a node meanwhile
                time.sleep(0.1)  # a slow step, so the run is still going when it grows

    class Chaos(UserCallback):
        def __init__(self):
            self.seen, self.removed_at, self.added = [], None, None
        def after_report(self, metrics, checkpoint):
            m = metrics[0]
            self.seen.append((m["step"], m["world_size"], m["start"]))
            if m["world_size"] == 2 and m["step"] == 2 and self.removed_at is None:
                self.removed_at = time.monotonic()
                cluster.remove_node(second, allow_graceful=False)  # rank 1's node: its bundle cannot come back
                # A lost machine takes its processes with it; here the node's raylet is killed but its worker
                # process would live on for a while (long enough to finish the run): end it as the machine would.
                try:
                    os.kill(metrics[1]["pid"], signal.SIGKILL)
                except ProcessLookupError:
                    pass
                gate.open.remote("removed")
            elif m["world_size"] == 1 and self.added is None:
                self.added = retried(lambda: cluster.add_node(num_cpus=1, **small), "new node")
                gate.open.remote("added")

    chaos = Chaos()
    started = time.monotonic()
    result = TorchTrainer(loop, train_loop_config={"steps": 40},
                          scaling_config=ScalingConfig(num_workers=(1, 2)),
                          run_config=RunConfig(name="elastic", storage_path=tempfile.mkdtemp(), callbacks=[chaos],
                                               failure_config=FailureConfig(max_failures=1))).fit()
    rows = result.metrics_dataframe[["step", "world_size", "start"]].values.tolist()  # rank 0's reports
    print("RESULT " + json.dumps({"rows": rows, "metrics": result.metrics, "seconds": time.monotonic() - started}))
    ray.shutdown()
    cluster.shutdown()
""")


@pytest.mark.scripts
@pytest.mark.timeout(600)
def test_elastic_run_shrinks_when_a_node_is_lost_and_grows_back(tmp_path):
    env = {**os.environ, "RAYTRAIN_NB_STORAGE_PATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=580, env=env)
    line = next((l for l in proc.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, (proc.stdout[-3000:], proc.stderr[-5000:])
    out = json.loads(line[7:])
    rows = [tuple(int(v) for v in r) for r in out["rows"]]  # (step, world size, start step) of each report
    sizes = [w for _, w, _ in rows]
    shrink = sizes.index(1)
    grow = shrink + sizes[shrink:].index(2)
    assert set(sizes[:shrink]) == {2} and set(sizes[shrink:grow]) == {1} and set(sizes[grow:]) == {2}
    # each time the loop resumed from the newest checkpoint: the step after the last one reported
    assert rows[shrink][2] == rows[shrink - 1][0] + 1 == rows[shrink][0] >= 3
    assert rows[grow][2] in (rows[grow - 1][0] + 1, rows[grow - 1][0] + 2) and rows[grow][0] == rows[grow][2]
    for segment in (rows[shrink:grow], rows[grow:]):  # no step skipped or repeated within an attempt
        assert [s for s, _, _ in segment] == list(range(segment[0][0], segment[0][0] + len(segment)))
    assert out["metrics"]["step"] == 39 and out["metrics"]["world_size"] == 2
    assert "continuing with 1 worker" in proc.stderr and "grow to 2 workers" in proc.stderr
