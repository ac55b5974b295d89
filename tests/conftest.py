"""Shared fixtures: one local Ray instance for the whole session."""
from __future__ import annotations

import os
import signal
import tempfile
import threading

import pytest

from raytrain_nb._internal.lean_entry import defer_iri_grammar

# This process is the integration tests' driver, as a kernel is: Ray's first import here (or nbformat's, at
# collection) without the IRI grammar built, as cluster.connect has it in a kernel
defer_iri_grammar()

# Enough logical CPUs for several small groups on a 2-core machine; small object store.
os.environ.setdefault("RAYTRAIN_NB_NUM_CPUS", "8")
os.environ.setdefault("RAYTRAIN_NB_OBJECT_STORE_BYTES", str(100 * 1024 * 1024))
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Each test lane (an xdist worker) its own runs folder: two lanes' runs never share a name's folder.
if "PYTEST_XDIST_WORKER" in os.environ or "RAYTRAIN_NB_STORAGE_PATH" not in os.environ:
    os.environ["RAYTRAIN_NB_STORAGE_PATH"] = tempfile.mkdtemp(prefix="rtnb-test-runs-")
# A shell without job control starts background commands with SIGINT ignored, and processes inherit that: the
# tests that press Ctrl-C on a kernel or a script would see nothing happen. Python's own handler, as in a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

pytest_plugins = ("tests.lanes",)


@pytest.fixture(autouse=True)
def _signal_handlers_as_before():
    """Puts back the SIGINT and SIGUSR1 handlers a test leaves changed.

    Ray Tune's ``Tuner.fit()`` installs its own SIGINT handler and leaves it after the sweep (a kernel puts its own back
    after each cell; this process is no kernel). A later test's Ctrl-C would only end a Tune run that is over, and
    the cell it meant to interrupt would run on until the test's timeout.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # handlers can only be set from the main thread
        return
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGUSR1)}
    yield
    for sig, handler in before.items():
        if handler is not None and signal.getsignal(sig) is not handler:
            signal.signal(sig, handler)


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray instance shared by every integration test."""
    import ray

    from raytrain_nb._internal import cluster

    cluster.connect()
    yield ray
    ray.shutdown()
