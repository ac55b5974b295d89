"""Keep-alive groups beside each other and on a cluster the user runs, in real kernels (``make survive-test``):
two notebooks on one machine keep their groups apart on the shared instance, and a group started on an existing
cluster (``--address``) is taken over by a new kernel connected to it, with no shared instance of ours started.
"""
from __future__ import annotations

import os
import selectors
import subprocess
import sys
import time

import pytest

from tests.notebook.nbkernel import START_TIMEOUT_S, Kernel, usage_error
from tests.survive.test_nb_survive import TRAIN, _digests, _kernel, env  # noqa: F401 - env is a fixture

pytestmark = pytest.mark.notebook

START = """%%distributed --workers 2 --cpus 0.5 --keep-alive {keep} --name {name} --no-dashboard{address}
import torch
from raytrain_nb.torch import prepare_model
torch.manual_seed(0)
model = prepare_model(torch.nn.Linear(8, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.05)"""

#: Holds a cluster of the test's own (``ray.cluster_utils.Cluster``: a head with its GCS, raylet and object store,
#: as ``ray start --head`` runs them) until its stdin closes; prints the address first.
HOLDER = """import sys
from ray.cluster_utils import Cluster
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 4, "object_store_memory": 100 * 2**20})
print(cluster.address, flush=True)
sys.stdin.read()
cluster.shutdown()
"""


def _restart(kernel: Kernel) -> None:
    """Jupyter's "Restart Kernel" (a shutdown request, then a new process), then the extension loaded again."""
    kernel.km.restart_kernel(now=False)
    kernel.pid = kernel.km.provisioner.process.pid
    kernel.kc.wait_for_ready(timeout=60)
    kernel.ok("%load_ext raytrain_nb")


def _runs(table: str) -> list:
    """The run names of ``%dist_groups``'s table (its first column, under the header)."""
    lines = [line for line in table.strip().splitlines() if line.strip()]
    return sorted(line.split()[0] for line in lines[1:]) if lines and lines[0].startswith("run ") else []


def _first_line(proc: subprocess.Popen, timeout: float) -> str:
    """The process's first line of stdout, or an error naming what it printed instead."""
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ)
        if not sel.select(timeout) or proc.poll() is not None:
            proc.kill()
            raise AssertionError(f"the cluster did not start within {timeout:.0f} s: {proc.communicate()}")
    return proc.stdout.readline().strip()


def test_a_group_on_an_existing_cluster_is_taken_over_by_a_new_kernel(tmp_path, env):
    ours = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=ours)
    kernel = None
    try:
        address = _first_line(holder, 120)
        kernel = _kernel(tmp_path, env)
        kernel.ok(START.format(keep="2m", name="remote", address=f" --address {address}"), timeout=START_TIMEOUT_S)
        kernel.ok(TRAIN)
        before = _digests(kernel)

        _restart(kernel)
        listed = kernel.ok(f"%dist_groups --address {address}").stdout
        assert _runs(listed) == ["remote"] and "(gone)" in listed, listed  # the old kernel is its owner, and it has ended
        started = time.monotonic()
        attached = kernel.ok(f"%dist_attach --address {address} --no-dashboard").stdout  # the only group there
        took = time.monotonic() - started
        assert "attached group remote (2 workers" in attached, attached
        assert _digests(kernel) == before
        kernel.ok(TRAIN)
        assert _digests(kernel) != before
        kernel.ok("%dist_shutdown")
        assert "no keep-alive group is alive here" in kernel.ok(f"%dist_groups --address {address}").stdout
        # the group lived on the user's cluster: no instance of our own was started for it
        assert not os.path.exists(os.path.join(env["RAYTRAIN_NB_INSTANCE_DIR"], "instance.json"))
        print(f"attach on an existing cluster after a restart: {took:.1f} s")
    finally:
        if kernel is not None and kernel.km.is_alive():
            kernel.close()
        holder.stdin.close()  # the holder shuts its cluster down
        try:
            holder.wait(timeout=60)
        except subprocess.TimeoutExpired:
            holder.kill()


def test_two_notebooks_keep_their_groups_apart(tmp_path, env):
    left, right = _kernel(tmp_path, env), None
    try:
        left.ok(START.format(keep="1m", name="left", address=""), timeout=START_TIMEOUT_S)
        right = _kernel(tmp_path, env)
        right.ok(START.format(keep="1m", name="right", address=""), timeout=START_TIMEOUT_S)
        # one instance, shared: both kernels' drivers reach the same supervisor's record
        assert len(os.listdir(env["RAYTRAIN_NB_INSTANCE_DIR"])) >= 1
        left.ok(TRAIN)
        right.ok(TRAIN)
        right.ok(TRAIN)
        mine, theirs = _digests(left), _digests(right)
        assert mine != theirs  # each group trained its own model

        # a run's name is its lease: the other notebook cannot start a second group under it
        clash = right.run("import raytrain_nb as _rt\n_rt.WorkerGroup(2, cpus_per_worker=0.5, name='left', "
                          "keep_alive='1m', activate=False)")
        said = clash.error_text
        assert "RunInUseError" in said and "in use by group 'left'" in said and f"pid {left.pid}" in said, said
        listed = left.ok("%dist_groups").stdout
        assert _runs(listed) == ["left", "right"] and listed.count("(alive)") == 2, listed

        _restart(left)
        several = left.run("%dist_attach --no-dashboard")
        said = usage_error(several) + several.error_text
        assert "2 keep-alive groups are alive: left, right; name one" in said, said
        refused = usage_error(left.run("%dist_attach right --no-dashboard"))
        assert "is attached to kernel pid" in refused and str(right.pid) in refused, refused
        left.ok("%dist_attach left --no-dashboard")
        assert _digests(left) == mine and _digests(right) == theirs
        left.ok(TRAIN)
        assert _digests(right) == theirs  # training one group leaves the other's model alone
        right.ok(TRAIN)
        left.ok("%dist_shutdown")
        assert _runs(right.ok("%dist_groups").stdout) == ["right"]
        right.ok("%dist_shutdown")
    finally:
        for k in (left, right):
            if k is not None and k.km.is_alive():
                k.close()
