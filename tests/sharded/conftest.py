"""Sharded models' heavier tests (restart, rescale, trainers at another world size): ``make sharded-test`` runs them
(``RAYTRAIN_NB_SHARDED=1``), CI in a step of its own; ``make test`` skips them (its budget)."""
from __future__ import annotations

import os

import pytest


def pytest_collection_modifyitems(config, items):
    if os.environ.get("RAYTRAIN_NB_SHARDED") == "1":
        return
    skip = pytest.mark.skip(reason="sharded models' heavier tests run in `make sharded-test` (CI: its own step)")
    for item in items:
        if "tests/sharded/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(skip)
