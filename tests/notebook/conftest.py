"""Fixtures for tests that run the magics in a real Jupyter kernel: one kernel per test module."""
from __future__ import annotations

import pytest

from .nbkernel import Kernel


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    """A kernel with ``%load_ext raytrain_nb`` done, its cwd a fresh folder; one per module."""
    k = Kernel(str(tmp_path_factory.mktemp("nb")))
    try:
        k.ok("%load_ext raytrain_nb")
        yield k
    finally:
        k.close()
