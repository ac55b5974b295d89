"""The group a module's integration tests share."""
from __future__ import annotations

import logging
import os

import pytest

from ..groups import SETUP, set_up_group


@pytest.fixture(scope="module")
def group(ray_session):
    """A 2-worker gloo group with a DDP model, shared by a module's tests."""
    with set_up_group(SETUP) as g:
        yield g


BUCKET = "raytrain-nb-test"


@pytest.fixture(scope="session")
def endpoint():
    """moto's S3 server on 127.0.0.1 (a free port), with fake credentials in the environment; one per session."""
    moto_server = pytest.importorskip("moto.server")
    s3fs = pytest.importorskip("s3fs")
    from raytrain_nb._internal.checkpoint import storage

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    url = f"http://{host}:{port}"
    env = pytest.MonkeyPatch()
    for key, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": url,
                       "AWS_CONFIG_FILE": os.devnull, "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
                       "NO_PROXY": "127.0.0.1", "no_proxy": "127.0.0.1"}.items():
        env.setenv(key, value)
    for key in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL_S3"):
        env.delenv(key, raising=False)
    s3fs.S3FileSystem.clear_instance_cache()
    fs, _ = storage.resolve(f"s3://{BUCKET}")
    fs.mkdir(BUCKET)
    yield url
    s3fs.S3FileSystem.clear_instance_cache()
    env.undo()
    server.stop()
