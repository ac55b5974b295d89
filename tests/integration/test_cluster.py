"""Ray connection and GPU assignment, each in a separate driver process (apart from the shared instance)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

GPU_SCRIPT = textwrap.dedent("""
    import json, os
    # the embedded instance, told it has 2 GPUs (Ray takes the count as given: this machine has none)
    os.environ.pop("RAY_ADDRESS", None)
    os.environ.update(RAYTRAIN_NB_NUM_CPUS="4", RAYTRAIN_NB_NUM_GPUS="2")
    from raytrain_nb import WorkerGroup, GroupError
    g = WorkerGroup(2, gpus_per_worker=1, backend="gloo")
    seen = g.execute(lambda: {k: os.environ.get(k) for k in ("CUDA_VISIBLE_DEVICES", "LOCAL_RANK", "RANK")}
                     | {"ray_gpu_ids": [str(i) for i in __import__("ray").get_gpu_ids()]})
    g.shutdown()
    try:
        WorkerGroup(3, gpus_per_worker=1)
        more = "no error"
    except GroupError as exc:
        more = str(exc)
    try:
        WorkerGroup(1, gpus_per_worker=1, start_timeout_s=300)   # nccl on a machine without CUDA
        nccl = "no error"
    except GroupError as exc:
        nccl = str(exc)
    print("RESULT " + json.dumps({"seen": seen, "more": more, "nccl": nccl}))
""")

ADDRESS_SCRIPT = textwrap.dedent("""
    import json, ray
    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal import cluster
    from raytrain_nb._internal.output import CollectSink
    g = WorkerGroup(1, backend="none")
    value = g.run("6 * 7", sink=CollectSink()).value
    g.shutdown()
    print("RESULT " + json.dumps({"value": value, "started_by_us": cluster.started_by_us(),
                                  "shipped": cluster.shipped_working_dir(),
                                  "address": ray.get_runtime_context().gcs_address}))
""")


def _run(script, env=None, timeout=600):
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                         env={**os.environ, **(env or {})})
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, f"no result; stderr:\n{out.stderr[-3000:]}"
    return json.loads(line[len("RESULT "):])


@pytest.mark.scripts
def test_each_rank_gets_its_own_gpu():
    res = _run(GPU_SCRIPT)
    seen = res["seen"]
    assert [s["RANK"] for s in seen] == ["0", "1"] and [s["LOCAL_RANK"] for s in seen] == ["0", "1"]
    devices = [s["CUDA_VISIBLE_DEVICES"] for s in seen]
    assert sorted(devices) == ["0", "1"], devices
    assert [s["ray_gpu_ids"] for s in seen] == [[d] for d in devices]
    assert "3 workers x 1 GPU = 3 GPU asked, but the cluster has 2 GPU" in res["more"]
    assert "could not form the process group" in res["nccl"] and "\n" not in res["nccl"]


@pytest.mark.scripts
def test_an_existing_cluster_is_used_through_ray_address(ray_session):
    address = ray_session.get_runtime_context().gcs_address
    res = _run(ADDRESS_SCRIPT, env={"RAY_ADDRESS": address})
    # a cluster on this machine: workers use the notebook's folder in place, nothing is copied
    assert res == {"value": "42", "started_by_us": False, "shipped": False, "address": address}


def test_the_embedded_instance_runs_without_ray_s_autoscaler_and_log_monitor(ray_session):
    from ray._private import parameter

    from raytrain_nb._internal import cluster, processes

    assert cluster.started_by_us()  # the session's instance is the embedded one
    ray_children = {pid: processes._command_line(str(pid)) for pid in processes.children(cluster.RAY_PROCESSES)}
    assert any("gcs_server" in cmd for cmd in ray_children.values()), ray_children  # Ray's own processes, seen
    assert not [cmd for cmd in ray_children.values() if "log_monitor.py" in cmd or "autoscaler" in cmd]
    assert parameter.RayParams.__init__.__qualname__ == "RayParams.__init__"  # only ray.init's call was changed
    # Ray's Python head processes run their scripts through lean_entry.py (the dashboard head, a child of
    # this process; the agents, whose commands the raylet was given)
    lean = "lean_entry.py " + os.path.join(os.path.dirname(ray_session.__file__), "")
    commands = " ".join(ray_children.values())
    assert commands.count(lean + os.path.join("dashboard", "dashboard.py")) == 1, ray_children
    raylet = [cmd for cmd in ray_children.values() if "raylet" in cmd.split()[0]]
    assert len(raylet) == 1 and lean + os.path.join("dashboard", "agent.py") in raylet[0], raylet
    assert lean + os.path.join("_private", "runtime_env", "agent", "main.py") in raylet[0], raylet


def test_its_workers_start_as_ray_s_own_without_building_jsonschema_s_iri_grammar(ray_session):
    """The raylet runs lean_entry.py: Ray's default_worker.py as __main__, no module of ours on sys.path,
    jsonschema's IRI check still right (it loads the grammar when first used) and the real package there."""
    import ray

    @ray.remote(num_cpus=0)
    def probe():
        import os
        import sys

        import jsonschema

        loaded_at_start = "rfc3987_syntax" in sys.modules
        checks = jsonschema.FormatChecker()
        iri = [checks.conforms("http://example.com/\u00fc", "iri"), checks.conforms("no iri", "iri")]
        import rfc3987_syntax

        return {"argv0": os.path.basename(sys.argv[0]), "shadowing": [p for p in sys.path if p.endswith("_internal")],
                "loaded_at_start": loaded_at_start, "iri": iri, "real": hasattr(rfc3987_syntax, "syntax_helpers")}

    seen = ray.get(probe.remote(), timeout=120)
    assert seen == {"argv0": "default_worker.py", "shadowing": [], "loaded_at_start": False, "iri": [True, False],
                    "real": True}, seen
