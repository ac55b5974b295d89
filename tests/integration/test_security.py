"""The embedded Ray instance runs with token authentication, set explicitly: a client without its token is refused.

The instance runs in a subprocess of its own, with a HOME of its own, so its token file is created fresh (and
the real ~/.ray is left alone); clients are subprocesses that see the token, a wrong one, or none.
"""
from __future__ import annotations

import json
import os
import queue
import stat
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest

from ..waiting import wait_for

pytestmark = pytest.mark.scripts  # every test starts a Ray instance or a client process of its own

REPO = Path(__file__).resolve().parents[2]
AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")

SERVER = textwrap.dedent("""
    import json, logging, os, sys
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("raytrain_nb").setLevel(logging.DEBUG)
    import ray
    from raytrain_nb._internal import cluster
    cluster.connect()
    print("READY " + json.dumps({"gcs": ray.get_runtime_context().gcs_address,
                                 "mode": os.environ.get("RAY_AUTH_MODE")}), flush=True)
    sys.stdin.read()  # until the test closes our stdin
    ray.shutdown()
""")

CLIENT = textwrap.dedent("""
    import json, sys
    from ray._raylet import GcsClient
    out = {}
    try:
        GcsClient(address=sys.argv[1]).internal_kv_get(b"probe", None, timeout=10)
        out["gcs"] = "ok"
    except Exception as exc:
        out["gcs"] = f"{type(exc).__name__}: {exc}"
    import ray
    try:
        ray.init(address=sys.argv[1], log_to_driver=False)
        out["init"] = "ok" if ray.cluster_resources().get("CPU") else "no resources"
        ray.shutdown()
    except Exception as exc:
        chain = []
        while exc is not None:
            chain.append(f"{type(exc).__name__}: {exc}")
            exc = exc.__cause__
        out["init"] = " <- ".join(chain)
    print("RESULT " + json.dumps(out))
""")


def _env(home: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    return {**env, "HOME": str(home), "RAYTRAIN_NB_NUM_CPUS": "1", **extra}


@pytest.fixture(scope="module")
def embedded(tmp_path_factory):
    """An embedded instance started by ``cluster.connect()`` in a subprocess whose HOME holds no token yet, and
    whose environment says ``RAY_AUTH_MODE=disabled`` (overridden: the embedded instance always uses a token)."""
    home = tmp_path_factory.mktemp("home")
    proc = subprocess.Popen([sys.executable, "-c", SERVER], cwd=REPO, env=_env(home, RAY_AUTH_MODE="disabled"),
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: "queue.Queue[str]" = queue.Queue()
    err: list = []
    threading.Thread(target=lambda: [lines.put(l) for l in proc.stdout], daemon=True).start()
    threading.Thread(target=lambda: [err.append(l) for l in proc.stderr], daemon=True).start()
    try:
        ready = wait_for(lambda: _ready(lines, proc), 240, "the embedded instance to start")
        assert ready != "exited", f"the server exited ({proc.returncode}):\n{''.join(err)[-3000:]}"
        yield {"home": home, "stderr": err, **json.loads(ready[len("READY "):])}
    finally:
        proc.stdin.close()
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()  # our own child, by its pid; Ray's reaper stops what it started
            proc.wait(timeout=30)


def _ready(lines: "queue.Queue[str]", proc: subprocess.Popen):
    try:
        line = lines.get_nowait()
        return line if line.startswith("READY ") else None
    except queue.Empty:
        return "exited" if proc.poll() is not None else None


def _client(embedded, home: Path, **extra: str) -> dict:
    # a refused ray.init retries the GCS for 20 s by default; 2 s shows the same refusal
    env = _env(home, RAY_gcs_server_port_wait_time_s="2", **extra)
    out = subprocess.run([sys.executable, "-c", CLIENT, embedded["gcs"]], cwd=REPO, env=env, capture_output=True,
                         text=True, timeout=180)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, f"no result; stderr:\n{out.stderr[-3000:]}"
    return json.loads(line[len("RESULT "):])


def _refused(text: str) -> bool:
    return "AuthenticationError" in text or "InvalidAuthToken" in text or "Unauthenticated" in text


def test_token_authentication_is_on_explicitly(embedded):
    assert embedded["mode"] == "token"
    log = "".join(embedded["stderr"])
    assert "RAY_AUTH_MODE=disabled ignored" in log


def test_the_token_file_is_created_for_its_owner_only(embedded):
    token = embedded["home"] / ".ray" / "auth_token"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600
    assert stat.S_IMODE(token.parent.stat().st_mode) == 0o700
    assert len(token.read_text().strip()) == 64 and os.listdir(token.parent) == ["auth_token"]
    assert f"created Ray's token file {token}, readable by its owner only (mode 0600)" in "".join(embedded["stderr"])


def test_a_client_without_the_token_is_refused(embedded, tmp_path):
    res = _client(embedded, tmp_path)  # a HOME without ~/.ray/auth_token, RAY_AUTH_MODE unset
    assert res["gcs"].startswith("AuthenticationError"), res
    assert res["init"] != "ok" and _refused(res["init"]), res


def test_a_client_with_a_wrong_token_is_refused(embedded, tmp_path):
    res = _client(embedded, tmp_path, RAY_AUTH_MODE="token", RAY_AUTH_TOKEN="0" * 64)
    assert res["gcs"].startswith("AuthenticationError"), res
    assert res["init"] != "ok" and _refused(res["init"]), res


def test_a_client_with_the_token_connects(embedded):
    res = _client(embedded, embedded["home"], RAY_AUTH_MODE="token")
    assert res == {"gcs": "ok", "init": "ok"}


TOKEN_SETUP = textwrap.dedent("""
    import json, os, stat, sys
    from raytrain_nb._internal import cluster
    from raytrain_nb._internal.errors import GroupError
    try:
        cluster.enable_token_auth()
        out = {"error": None}
    except GroupError as exc:
        out = {"error": str(exc)}
    print("RESULT " + json.dumps(out))
""")


def _setup(home: Path, **extra: str) -> dict:
    out = subprocess.run([sys.executable, "-c", TOKEN_SETUP], cwd=REPO, env=_env(home, **extra),
                         capture_output=True, text=True, timeout=120)
    line = next((l for l in out.stdout.splitlines() if l.startswith("RESULT ")), None)
    assert line, f"no result; stderr:\n{out.stderr[-3000:]}"
    return json.loads(line[len("RESULT "):])


def test_an_existing_token_is_used_as_it_is(tmp_path):
    token = tmp_path / ".ray" / "auth_token"
    token.parent.mkdir()
    token.write_text("a" * 64)
    token.chmod(0o640)
    assert _setup(tmp_path) == {"error": None}
    assert token.read_text() == "a" * 64 and stat.S_IMODE(token.stat().st_mode) == 0o640  # the user's own file


def test_a_token_path_naming_no_file_is_refused(tmp_path):
    missing = tmp_path / "nowhere" / "token"
    res = _setup(tmp_path, RAY_AUTH_TOKEN_PATH=str(missing))
    assert res["error"].startswith(f"RAY_AUTH_TOKEN_PATH={missing} names no file holding a token")
    assert "\n" not in res["error"] and not missing.exists()
