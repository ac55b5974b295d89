"""Fixtures shared by the storage and checkpoint unit tests."""
from __future__ import annotations

import uuid

import pytest
from fsspec.implementations.memory import MemoryFileSystem


@pytest.fixture
def mem_url():
    """A fresh memory:// directory, removed afterwards."""
    root = f"/t-{uuid.uuid4().hex[:8]}"
    yield f"memory://{root}"
    fs = MemoryFileSystem()
    if fs.exists(root):
        fs.rm(root, recursive=True)


@pytest.fixture(params=["local", "memory"])
def run_url(request, tmp_path, mem_url):
    """A run directory on the local disk (commit by rename) and on memory:// (commit by marker)."""
    return str(tmp_path / "run") if request.param == "local" else mem_url + "/run"
