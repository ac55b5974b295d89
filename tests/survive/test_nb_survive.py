"""A keep-alive group outlives its kernel, in real kernels: a restart through the kernel manager, a SIGKILL, a
keep-alive that runs out, two kernels contending for one group (``make survive-test``, outside ``make test``).

Every kernel here shares one instance record folder and one storage folder of the test's own, so nothing meets the
user's (or another test's) shared instance; the supervisor's pid comes from that record, and every process it
started is checked gone at the end.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.notebook.nbkernel import START_TIMEOUT_S, Kernel, usage_error
from tests.waiting import wait_for

pytestmark = pytest.mark.notebook

SETUP = """%%distributed --workers 2 --keep-alive {keep} --name {name} --no-dashboard
import torch
from raytrain_nb.torch import prepare_model
torch.manual_seed(0)
model = prepare_model(torch.nn.Linear(8, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.05)"""

TRAIN = """%%distributed
import raytrain_nb as train
for step in range(5):
    opt.zero_grad(); model(torch.ones(4, 8)).pow(2).sum().backward(); opt.step()
with torch.no_grad():
    digest = [round(float(p.double().sum()), 10) for p in model.parameters()] + \\
             [round(float(v.double().sum()), 10) for s in opt.state.values() for v in s.values() if torch.is_tensor(v)]"""

PULL_DIGEST = "%dist_pull digest --all\nprint(__import__('json').dumps(digest))"


def _digests(kernel: Kernel) -> list:
    return json.loads(kernel.ok(PULL_DIGEST).stdout.strip().splitlines()[-1])


def _record(folder: str) -> dict:
    with open(os.path.join(folder, "instance.json")) as fh:
        return json.load(fh)


def _tree(pid: int) -> list:
    """The supervisor and every process under it (the Ray head's processes and the workers)."""
    root = psutil.Process(pid)
    return [root] + root.children(recursive=True)


def _gone(procs: list, timeout: float) -> None:
    _, alive = psutil.wait_procs(procs, timeout=timeout)
    alive = [p for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
    assert not alive, f"still running: {[(p.pid, p.name()) for p in alive]}"


@pytest.fixture
def env(tmp_path):
    """The test's own record folder and storage; whatever instance the test leaves (a failed one) is ended by pid."""
    folder = tmp_path / "instance"
    yield {"RAYTRAIN_NB_INSTANCE_DIR": str(folder), "RAYTRAIN_NB_STORAGE_PATH": str(tmp_path / "runs"),
           "RAYTRAIN_NB_UI": "text"}
    try:
        procs = _tree(_record(str(folder))["pid"])
    except (OSError, ValueError, KeyError, psutil.NoSuchProcess):
        return
    procs[0].terminate()  # the supervisor shuts its instance down on SIGTERM
    _, alive = psutil.wait_procs(procs, timeout=30)
    for proc in alive:
        proc.kill()


def _kernel(tmp_path, env) -> Kernel:
    k = Kernel(str(tmp_path), env=env)
    k.ok("%load_ext raytrain_nb")
    return k


def _kill(kernel: Kernel) -> None:
    """SIGKILL the kernel process (an OOM kill), then let the kernel manager start a new one."""
    os.kill(kernel.pid, signal.SIGKILL)
    wait_for(lambda: not psutil.pid_exists(kernel.pid) or psutil.Process(kernel.pid).status() == "zombie", 30,
             "the killed kernel to end")
    kernel.km.restart_kernel(now=True)
    kernel.pid = kernel.km.provisioner.process.pid
    kernel.kc.wait_for_ready(timeout=60)


def test_restart_and_sigkill_keep_the_warm_group(tmp_path, env):
    kernel = _kernel(tmp_path, env)
    try:
        kernel.ok(SETUP.format(keep="2m", name="warm"), timeout=START_TIMEOUT_S)
        kernel.ok(TRAIN)
        before = _digests(kernel)
        assert before[0] == before[1]
        supervisor = _record(env["RAYTRAIN_NB_INSTANCE_DIR"])["pid"]
        assert supervisor not in {p.pid for p in psutil.Process(kernel.pid).children(recursive=True)}

        kernel.km.restart_kernel(now=False)  # Jupyter's "Restart Kernel": a shutdown request, then a new process
        kernel.pid = kernel.km.provisioner.process.pid
        kernel.kc.wait_for_ready(timeout=60)
        kernel.ok("%load_ext raytrain_nb")
        started = time.monotonic()
        attached = kernel.ok("%dist_attach --no-dashboard").stdout
        took = time.monotonic() - started
        assert "attached group warm (2 workers" in attached, attached
        assert _digests(kernel) == before  # weights and optimizer state as they were
        history = kernel.ok("%dist_history").stdout
        assert "setup     0        import torch" in history and "training  0        import raytrain_nb as train" \
            in history, history
        kernel.ok(TRAIN)
        after_restart = _digests(kernel)
        assert after_restart != before and after_restart[0] == after_restart[1]
        print(f"attach after a restart: {took:.1f} s")

        # the kernel is killed, and a worker dies while no kernel is attached: the group is attached failed
        worker = int(kernel.ok("import raytrain_nb as _rt\n_rt.active_group().status()[1].pid").value)
        _kill(kernel)
        os.kill(worker, signal.SIGKILL)
        kernel.ok("%load_ext raytrain_nb")
        attached = kernel.ok("%dist_attach warm --no-dashboard").stdout
        assert "rank(s) 1 died meanwhile: %dist_restart replaces them" in attached, attached
        kernel.ok("%dist_restart")  # rank 1 from its live peer, as after any worker's death
        assert _digests(kernel) == after_restart
        kernel.ok(TRAIN)
        status = kernel.ok("%dist_status").stdout
        assert status.count("idle") >= 2, status

        procs = _tree(supervisor)
        kernel.ok("%dist_shutdown")
        events = (tmp_path / "runs" / "warm" / "events.log").read_text()
        assert "shut down by its driver" in events, events
        kernel.close()
        _gone(procs, 60)  # nothing needs the instance: the supervisor stopped it
        assert not os.path.exists(os.path.join(env["RAYTRAIN_NB_INSTANCE_DIR"], "instance.json"))
    finally:
        if kernel.km.is_alive():
            kernel.close()


CHECK_TABLES = """
import json, os, sys, time, ray
from raytrain_nb._internal import cluster
cluster.connect(shared=True)
from ray.util import placement_group_table
deadline = time.time() + 60
while time.time() < deadline and not (os.path.exists(sys.argv[1]) and "ran out" in open(sys.argv[1]).read()):
    time.sleep(0.2)  # the log is written from the custodian's first event on
time.sleep(1.0)
actors = [a for a in ray.util.list_named_actors(all_namespaces=True)]
from ray._private import state  # the GCS's own actor table (the state API needs Ray's dashboard, which is off)
alive = [a["ActorClassName"] for a in state.actors().values() if a["State"] == "ALIVE"]
pgs = [p for p in placement_group_table().values() if p["state"] != "REMOVED"]
print(json.dumps({"named": actors, "alive": alive, "pgs": pgs}))
"""


def test_keep_alive_runs_out_and_frees_everything(tmp_path, env):
    kernel = _kernel(tmp_path, env)
    try:
        kernel.ok(SETUP.format(keep="4s", name="brief"), timeout=START_TIMEOUT_S)
        supervisor = _record(env["RAYTRAIN_NB_INSTANCE_DIR"])["pid"]
        procs = _tree(supervisor)
        assert len(procs) > 3, procs
        events = tmp_path / "runs" / "brief" / "events.log"
        os.kill(kernel.pid, signal.SIGKILL)
        # a driver that stays connected meanwhile keeps the instance up, so Ray's tables can be read after the end
        script = tmp_path / "check.py"
        script.write_text(CHECK_TABLES)
        out = subprocess.run([sys.executable, str(script), str(events)], capture_output=True, text=True, timeout=180,
                             env={**os.environ, **env})
        assert out.returncode == 0, out.stderr
        tables = json.loads(out.stdout.strip().splitlines()[-1])
        assert tables["named"] == [] and tables["pgs"] == [], tables
        assert "Worker" not in tables["alive"] and "Custodian" not in tables["alive"], tables
        lines = events.read_text()
        assert "kernel ended" in lines and "keep-alive of 4 s ran out with no driver attached" in lines, lines
        assert not (tmp_path / "runs" / "brief" / ".lease").exists()
        _gone(procs, 60)  # the last driver left: the supervisor stopped the instance, every Ray process with it
    finally:
        kernel.km.shutdown_kernel(now=True)
        kernel.kc.stop_channels()


def test_two_kernels_contend_for_one_group(tmp_path, env):
    first, second = _kernel(tmp_path, env), None
    try:
        first.ok(SETUP.format(keep="1m", name="shared"), timeout=START_TIMEOUT_S)
        second = _kernel(tmp_path, env)
        groups = second.ok("%dist_groups").stdout
        assert "shared" in groups and "(alive)" in groups, groups
        refused = usage_error(second.run("%dist_attach shared"))
        assert "is attached to kernel pid" in refused and str(first.pid) in refused and "--steal" in refused, refused
        second.ok("%dist_attach shared --steal --no-dashboard")
        second.ok(TRAIN)
        taken = first.run(TRAIN)
        assert "was taken over by kernel pid" in usage_error(taken) + taken.error_text + taken.stderr
        second.ok("%dist_shutdown")
    finally:
        for k in (first, second):
            if k is not None and k.km.is_alive():
                k.close()


BACKGROUND = """%%distributed --background
import os, tempfile, time
import raytrain_nb as train
rank = train.get_context().get_world_rank()
for step in range(40):
    opt.zero_grad(); model(torch.ones(4, 8)).pow(2).sum().backward(); opt.step()
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, f"rank{rank}.txt"), "w") as f:
            f.write(str(step))
        train.report({"step": step}, checkpoint=train.Checkpoint.from_directory(d))
    print(f"step {step}", flush=True)
    if rank == 0:
        open(f"at-step-{step}", "w").close()  # in the kernel's folder: the test waits for it
    time.sleep(0.5)"""


def test_a_background_cell_survives_the_kernel(tmp_path, env):
    kernel = _kernel(tmp_path, env)
    try:
        kernel.ok(SETUP.format(keep="2m", name="bg"), timeout=START_TIMEOUT_S)
        kernel.ok(BACKGROUND)
        wait_for(lambda: (tmp_path / "at-step-2").exists(), 120, "the background cell's third step")
        _kill(kernel)
        kernel.ok("%load_ext raytrain_nb")
        attach = kernel.ok("%dist_attach bg --no-dashboard")
        steps_done = len(list(tmp_path.glob("at-step-*")))
        assert "still runs on rank(s) 0, 1" in attach.stdout, (attach.stdout, steps_done, kernel.ok("%dist_status").stdout,
                                                               (tmp_path / "runs" / "bg" / "events.log").read_text())
        kernel.wait_for(attach, lambda m: m.type == "stream" and "the cell started in another kernel has ended"
                        in m.content["text"], timeout=60)
        shown = attach.stdout
        assert "step 39" in shown, shown  # its output from the attach on, to its last line
        kernel.ok("%dist_wait")
        listed = kernel.ok("import raytrain_nb as _rt\n"
                           "sorted(e.metrics['step'] for e in _rt.active_group().checkpoints('reported'))").value
        steps = json.loads(listed)
        # every report but the one in flight at the attach (its set was settled incomplete then) is committed
        assert steps[-1] == 39 and len(steps) >= 38, listed
        kernel.ok(TRAIN)  # the group takes cells again
        kernel.ok("%dist_shutdown")
    finally:
        if kernel.km.is_alive():
            kernel.close()
