"""A real JupyterLab server and a headless Chromium for end-to-end tests.

The server runs from this interpreter's environment on 127.0.0.1 with a token, in a temporary
root, with its own settings folder (the news toast off). Debian's Chromium is driven by
Playwright; its browser downloads are never used.
"""
from __future__ import annotations

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Dict, Optional

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--disable-dev-shm-usage"]
START_TIMEOUT_S = 90.0


def missing() -> Optional[str]:
    """Why the browser test cannot run here, or None."""
    if not os.path.exists(CHROMIUM):
        return f"{CHROMIUM} is missing: apt-get install -y chromium"
    for module in ("playwright", "jupyterlab", "notebook"):
        try:
            __import__(module)
        except ImportError:
            return f"python package {module} is missing: pip install -e '.[dev]'"
    return None


def require() -> None:
    """Skip the calling test when it cannot run here, except under CI (``CI=true``), where it fails."""
    import pytest  # pytest: only the tests that use this module call it

    why = missing()
    if why is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"the browser test cannot run under CI: {why}")
    pytest.skip(why)


def _die_with_parent() -> None:
    """In the server's process: get SIGTERM when the test process dies, even if it is killed."""
    import ctypes

    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: The front ends a test can open: the server module to run and where a notebook's page is.
APPS = {"lab": ("jupyterlab", "lab/tree"), "notebook": ("notebook", "notebooks")}


class LabServer:
    """``jupyter lab`` (or Jupyter Notebook 7, ``app="notebook"``) in its own process group; :meth:`stop`
    ends it and its kernels."""

    def __init__(self, root: Path, env: Optional[Dict[str, str]] = None, app: str = "lab") -> None:
        self.root = root
        self.token = secrets.token_hex(16)
        self.port = _free_port()
        settings = root.parent / "lab-settings"
        notes = settings / "@jupyterlab" / "apputils-extension"
        notes.mkdir(parents=True, exist_ok=True)
        (notes / "notification.jupyterlab-settings").write_text(
            json.dumps({"fetchNews": "false", "checkForUpdates": False}))
        full_env = dict(os.environ, JUPYTERLAB_SETTINGS_DIR=str(settings),
                        JUPYTERLAB_WORKSPACES_DIR=str(root.parent / "lab-workspaces"), **(env or {}))
        full_env.pop("JUPYTER_TOKEN", None)
        self.log = open(root.parent / f"jupyter-{app}.log", "w")
        module, self.page_path = APPS[app]
        cmd = [sys.executable, "-m", module, "--no-browser", "--allow-root", "--ip=127.0.0.1",
               f"--port={self.port}", f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}"]
        self.proc = subprocess.Popen(cmd, cwd=root, env=full_env, stdout=self.log, stderr=subprocess.STDOUT,
                                     start_new_session=True, preexec_fn=_die_with_parent)
        self._wait_ready()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def url(self, notebook: str) -> str:
        return f"{self.base}/{self.page_path}/{notebook}?token={self.token}"

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter lab exited with {self.proc.returncode}: see {self.log.name}")
            try:
                with urllib.request.urlopen(f"{self.base}/api/status?token={self.token}", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            try:  # a pause that also notices the server exiting
                self.proc.wait(timeout=0.2)
            except subprocess.TimeoutExpired:
                pass
        raise TimeoutError(f"jupyter lab did not answer within {START_TIMEOUT_S:g} s: see {self.log.name}")

    def _api(self, method: str, path: str, body: Optional[dict] = None) -> dict:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(f"{self.base}/api/{path}?token={self.token}", data=data, method=method,
                                         headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as r:
            return json.loads(r.read() or b"{}")

    def start_kernel(self, notebook: str, kernel: str = "python3") -> str:
        """Start ``notebook``'s kernel session through the server's REST API; the page joins it when it opens.

        Without it the front end starts the kernel itself, and when that start fails or comes before the front
        end has the kernel specs (a page still loading on a busy machine), it asks with a "Select Kernel" dialog
        that swallows the keys meant for the first cell. Returns the kernel's id.
        """
        session = self._api("POST", "sessions", {"path": notebook, "name": notebook, "type": "notebook",
                                                  "kernel": {"name": kernel}})
        return session["kernel"]["id"]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()

