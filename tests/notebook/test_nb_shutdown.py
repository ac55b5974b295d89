"""Shutting a kernel down (Jupyter's "Shut Down Kernel") leaves none of the Ray processes it started."""
from __future__ import annotations

import json

import psutil
import pytest

from .nbkernel import START_TIMEOUT_S, Kernel

pytestmark = pytest.mark.notebook

#: jupyter_client waits up to 5 s for a graceful exit, then signals the kernel.
GONE_WITHIN_S = 60.0

PROCESSES = """\
import json, os, psutil, ray
node = ray._private.worker._global_node
print(json.dumps({
    "session": node.session_name,
    "ray": {name: [p.process.pid for p in procs] for name, procs in node.all_processes.items()},
    "children": [c.pid for c in psutil.Process().children(recursive=True)],
}))
"""


def _running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def test_kernel_shutdown_leaves_no_ray_process_it_started(tmp_path):
    kernel = Kernel(str(tmp_path))
    try:
        kernel.ok("%load_ext raytrain_nb")
        kernel.ok("%%distributed --workers 2\nimport os\npid = os.getpid()", timeout=START_TIMEOUT_S)
        worker_pids = json.loads(kernel.ok("%dist_pull pid --all\nimport json\nprint(json.dumps(pid))").stdout)
        found = json.loads(kernel.ok(PROCESSES).stdout)
        assert {"gcs_server", "raylet"} <= set(found["ray"]), found
        assert set(worker_pids) <= set(found["children"]), found  # the actors are the kernel's descendants
        pids = {kernel.pid, *worker_pids, *found["children"], *(p for ps in found["ray"].values() for p in ps)}
        # Process objects remember each start time, so a recycled pid never counts as ours.
        procs = [psutil.Process(pid) for pid in sorted(pids)]
        assert all(_running(p) for p in procs)

        kernel.km.shutdown_kernel(now=False)

        psutil.wait_procs(procs, timeout=GONE_WITHIN_S)
        left = [f"{p.pid} {p.name()}" for p in procs if _running(p)]
        assert not left, f"still running after the kernel shut down (session {found['session']}): {left}"
        assert not kernel.km.is_alive()
    finally:
        if kernel.km.is_alive():
            kernel.km.shutdown_kernel(now=False)
        kernel.kc.stop_channels()
