"""The group a module's integration tests share."""
from __future__ import annotations

import pytest

from ..groups import SETUP, set_up_group


@pytest.fixture(scope="module")
def group(ray_session):
    """A 2-worker gloo group with a DDP model, shared by a module's tests."""
    with set_up_group(SETUP) as g:
        yield g

