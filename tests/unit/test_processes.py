"""A Ray start that fails midway leaves no process behind: cluster.connect ends what the attempt started."""
from __future__ import annotations

import os
import subprocess
import sys
import types

import pytest

from raytrain_nb import GroupError
from raytrain_nb._internal import cluster, processes


def _seen(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/stat") as fh:
            stat = fh.read().rsplit(")", 1)[1].split()[:2]
    except OSError as exc:
        stat = [repr(exc)]
    return (f"state/parent {stat}, this process {os.getpid()}, command line "
            f"{processes._command_line(str(pid))!r}, children {sorted(processes.children())}")


def test_a_failed_start_ends_the_processes_it_started_and_only_those(monkeypatch, tmp_path):
    unrelated = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    started = []

    def init(**_):
        # as Ray's node start does: its GCS (a binary inside Ray's package) is up, then the start times out
        # (Python keeps its argv in its command line; a shell may exec its last command and lose it)
        started.append(subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)",
                                         f"{cluster.RAY_PROCESSES}gcs_server"]))
        raise RuntimeError("The current node timed out during startup.")

    # the start imports Ray's private modules (lean_head); load the real ones before the stand-in takes "ray"
    pytest.importorskip("ray._private.services")
    fake = types.SimpleNamespace(init=init, shutdown=lambda: None, is_initialized=lambda: False)
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setattr(cluster, "_started_by_us", False)
    monkeypatch.setattr(cluster, "enable_token_auth", lambda: None)
    monkeypatch.setenv("RAYTRAIN_NB_NUM_CPUS", "1")
    logged = []
    monkeypatch.setattr(processes.logger, "debug", lambda *a: logged.append(a[0] % a[1:]))
    try:
        with pytest.raises(GroupError, match="could not connect to a local Ray instance: The current node timed out"):
            cluster.connect()
        assert len(started) == cluster._STARTUP_ATTEMPTS
        for proc in started:  # ended (a 60 s sleep), each after its own attempt; reaped there, or here
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:  # say what the start's cleanup could have seen of it
                pytest.fail(f"stand-in {proc.pid} still runs: {_seen(proc.pid)}; attempts logged: {logged}")
            assert proc.pid not in processes.children()
        assert unrelated.poll() is None and unrelated.pid in processes.children()  # not Ray's: left alone
    finally:
        unrelated.kill()
        unrelated.wait(timeout=10)
