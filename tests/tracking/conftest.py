"""The tracking tests' real parts: an MLflow tracking server on 127.0.0.1 (SQLite store), W&B in offline mode.

``mlflow server`` is the full ``mlflow`` package's, which `make tracking-test` installs in a venv of its own
(``.venv-mlflow-server``: it pins pyarrow below what Ray Data uses here); ``MLFLOW_SERVER_EXE`` names another.
Without it (or without the clients, ``pip install -e '.[mlflow,wandb]'``) these tests skip.
"""
from __future__ import annotations

import os
import pathlib
import signal
import socket
import subprocess
import urllib.request

import pytest

from tests.waiting import wait_for

REPO = pathlib.Path(__file__).resolve().parents[2]
SERVER_START_S = 180.0  # a cold start on a loaded 2-core machine took 45 s


def server_exe():
    """The ``mlflow`` executable that can serve (the full package), or None."""
    given = os.environ.get("MLFLOW_SERVER_EXE")
    if given:
        return given
    own = REPO / ".venv-mlflow-server" / "bin" / "mlflow"
    return str(own) if own.exists() else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory):
    """A real ``mlflow server`` on 127.0.0.1 with a SQLite store, for the whole session; ended by its PID."""
    pytest.importorskip("mlflow")
    exe = server_exe()
    if exe is None:
        pytest.skip("no MLflow server: make tracking-test installs one in .venv-mlflow-server (or set "
                    "MLFLOW_SERVER_EXE)")
    root = tmp_path_factory.mktemp("mlflow")
    url = f"http://127.0.0.1:{_free_port()}"
    log = open(root / "server.log", "wb")
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    proc = subprocess.Popen([exe, "server", "--backend-store-uri", f"sqlite:///{root}/mlflow.db",
                             "--artifacts-destination", str(root / "artifacts"), "--host", "127.0.0.1",
                             "--port", url.rsplit(":", 1)[1], "--workers", "1"],
                            stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        wait_for(lambda: proc.poll() is not None or _answers(url), SERVER_START_S, f"mlflow server at {url} to answer")
        if proc.poll() is not None:
            pytest.fail(f"mlflow server exited with {proc.returncode}: {(root / 'server.log').read_text()[-3000:]}")
        yield url
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)  # its own session: the server and its workers
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
        log.close()


@pytest.fixture
def wandb_offline(monkeypatch, tmp_path):
    """W&B in offline mode: nothing leaves the machine; its settings folder in the test's tmp."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "wandb-config"))
    monkeypatch.setenv("WANDB_CACHE_DIR", str(tmp_path / "wandb-cache"))
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
