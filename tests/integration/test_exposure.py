"""Nothing we open listens beyond loopback for a group on one machine, and one owner per run.

Ray's own servers (GCS, raylet, agents, each worker's gRPC server) listen on every interface: Ray
has no option to bind them to loopback, and its token authentication guards them
(test_security.py). What the project opens itself, the rendezvous store and gloo's connections,
must listen on 127.0.0.1 only.
"""
from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from raytrain_nb import WorkerGroup
from raytrain_nb._internal.checkpoint import lease as lease_mod
from raytrain_nb._internal.errors import RunInUseError

from ..groups import STEP, quiet
from ..waiting import wait_for

pytestmark = pytest.mark.ray


def _listeners(proc):
    try:
        return [(c.laddr.ip, c.laddr.port) for c in proc.net_connections("inet") if c.status == psutil.CONN_LISTEN]
    except psutil.Error:
        return []


def _loopback(ip):
    return ipaddress.ip_address(ip.split("%")[0]).is_loopback


def _ray_core_ports():
    """pid -> the gRPC port of that actor's Ray core worker (Ray's own server in our worker processes)."""
    from ray._private.state import state

    return {a["Pid"]: a["Address"]["Port"] for a in state.actor_table(None).values() if a.get("State") == "ALIVE"}


def test_a_one_machine_group_opens_nothing_beyond_loopback(group):
    quiet(group, STEP)  # a DDP step: the process group and its gloo connections are in use
    me = psutil.Process()
    workers = {r.pid for r in group.status()}
    ray_ports = _ray_core_ports()
    problems = []
    for proc in [me] + me.children(recursive=True):
        exposed = [(ip, port) for ip, port in _listeners(proc) if not _loopback(ip)]
        if proc.pid in workers:  # ours: only Ray's core-worker server may listen beyond loopback
            ours = [(ip, port) for ip, port in exposed if port != ray_ports.get(proc.pid)]
            problems += [f"rank process {proc.pid} listens on {ip}:{port}" for ip, port in ours]
            continue
        try:
            command = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        is_ray = proc.pid == me.pid or "/ray/" in command or proc.name().startswith(("raylet", "gcs_server", "ray::"))
        if exposed and not is_ray:
            problems.append(f"process {proc.pid} ({command[:80]}) listens on {exposed}")
    assert workers and not problems, "\n".join(problems)
    # and the rendezvous store and gloo do listen, on loopback, in the rank processes
    local = [l for pid in workers for l in _listeners(psutil.Process(pid)) if _loopback(l[0])]
    assert local, "the ranks' process group should listen on 127.0.0.1"


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_two_groups_on_one_run(ray_session, tmp_path, monkeypatch):
    first = WorkerGroup(1, storage_path=str(tmp_path), name="shared", activate=False)
    try:
        start = time.monotonic()
        with pytest.raises(RunInUseError, match=r"run .*shared is in use by group 'shared' \(host .*, pid "
                                                rf"{os.getpid()}, since .*\): pick another --name, or wait"):
            WorkerGroup(1, storage_path=str(tmp_path), name="shared", activate=False)
        assert time.monotonic() - start < 1.0  # refused at once, before Ray places anything
    finally:
        first.shutdown()
    second = WorkerGroup(1, storage_path=str(tmp_path), name="shared", activate=False)  # opens once the first ended
    second.shutdown()


def test_a_stale_lease_is_taken_over_with_a_warning(tmp_path, caplog):
    run = tmp_path / "stale"
    run.mkdir()
    # an owner on another machine that stopped renewing its lease two minutes ago (its machine was lost)
    stale = {"token": "t", "owner": "group 'elsewhere'", "host": "another-host", "pid": 1,
             "started": time.time() - 600, "renewed": time.time() - lease_mod.STALE_S - 60}
    (run / ".lease").write_text(json.dumps(stale))
    taken = lease_mod.RunLease(str(run), "group 'here'")
    try:
        assert taken.held() and any("taking over the run's lease" in r.message and "last renewed" in r.message
                                    for r in caplog.records)
    finally:
        taken.release()
    stale["renewed"] = time.time()  # renewed just now: still in use, not taken over
    (run / ".lease").write_text(json.dumps(stale))
    with pytest.raises(RunInUseError, match="in use by group 'elsewhere' \\(host another-host, pid 1"):
        lease_mod.RunLease(str(run), "group 'here'")


def test_a_lease_of_an_owner_that_ended_on_this_machine_is_taken_over_at_once(tmp_path):
    run = tmp_path / "ended"
    code = textwrap.dedent(f"""
        import os
        from raytrain_nb._internal.checkpoint.lease import RunLease
        RunLease({str(run)!r}, "a killed kernel")
        os._exit(0)  # ends without releasing it, as a killed kernel would
    """)
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
    assert (run / ".lease").exists()
    lease = lease_mod.RunLease(str(run), "group 'next'")  # no wait for staleness: the pid is gone
    lease.release()
    assert not (run / ".lease").exists()


def _wait_for_flag(config):
    import os as _os
    import time as _time

    deadline = _time.monotonic() + 120
    while not _os.path.exists(config["flag"]):
        assert _time.monotonic() < deadline, "the test never let the first trainer finish"
        _time.sleep(0.05)


def test_two_trainers_on_one_run(ray_session, tmp_path):
    import threading

    from raytrain_nb import RunConfig, ScalingConfig
    from raytrain_nb.torch import TorchTrainer

    def trainer():
        return TorchTrainer(_wait_for_flag, train_loop_config={"flag": str(tmp_path / "go")},
                            scaling_config=ScalingConfig(num_workers=1),
                            run_config=RunConfig(name="trained", storage_path=str(tmp_path / "runs"), verbose=0))

    results = {}
    first = threading.Thread(target=lambda: results.setdefault("first", trainer().fit()), daemon=True)
    first.start()
    try:
        wait_for(lambda: (tmp_path / "runs" / "trained" / ".lease").exists(), 120, "the first trainer to start")
        with pytest.raises(RunInUseError, match=r"is in use by group 'trained'"):
            trainer().fit()
    finally:
        (tmp_path / "go").touch()
        first.join(120)
    assert results["first"].error is None
    assert not (tmp_path / "runs" / "trained" / ".lease").exists()  # released when fit() ended
