"""Shared fixtures: one local Ray instance for the whole session."""
from __future__ import annotations

import os
import tempfile

import pytest

from raytrain_nb._internal.lean_entry import defer_iri_grammar

# This process is the integration tests' driver, as a kernel is: Ray's first import here (or nbformat's, at
# collection) without the IRI grammar built, as cluster.connect has it in a kernel
defer_iri_grammar()

# Enough logical CPUs for several small groups on a 2-core machine; small object store.
os.environ.setdefault("RAYTRAIN_NB_NUM_CPUS", "8")
os.environ.setdefault("RAYTRAIN_NB_OBJECT_STORE_BYTES", str(100 * 1024 * 1024))
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("RAYTRAIN_NB_STORAGE_PATH", tempfile.mkdtemp(prefix="rtnb-test-runs-"))


@pytest.fixture(scope="session")
def ray_session():
    """A real local Ray instance shared by every integration test."""
    import ray

    from raytrain_nb._internal import cluster

    cluster.connect()
    yield ray
    ray.shutdown()
