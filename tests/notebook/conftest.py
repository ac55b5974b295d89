"""Fixtures for tests that run the magics in a real Jupyter kernel: one kernel handed on from module to module."""
from __future__ import annotations

from typing import Dict, Iterator

import pytest

from .nbkernel import Kernel


def _new_kernel(folder: str) -> Kernel:
    k = Kernel(folder)
    k.ok("%load_ext raytrain_nb")
    return k


@pytest.fixture(scope="session")
def _kernels() -> Iterator[Dict[str, Kernel]]:
    """The kernel the modules hand on (made by the first one that asks); stopped at the session's end."""
    holder: Dict[str, Kernel] = {}
    yield holder
    if holder:
        holder["kernel"].close()


@pytest.fixture(scope="module")
def kernel(_kernels, tmp_path_factory, request):
    """A kernel with ``%load_ext raytrain_nb`` done, no group, an empty namespace, its cwd a fresh folder.

    The session's kernel, reset for this module (its Ray instance starts once, not per module), or a new one
    where the reset failed. A module that must have a kernel of its own (a first cell that also starts Ray)
    sets ``FRESH_KERNEL = True``.
    """
    folder = str(tmp_path_factory.mktemp("nb"))
    if getattr(request.module, "FRESH_KERNEL", False):
        k = _new_kernel(folder)
        try:
            yield k
        finally:
            k.close()
        return
    k = _kernels.get("kernel")
    if k is not None and not k.hand_on(folder):
        k.close()
        k = None
    if k is None:
        k = _kernels["kernel"] = _new_kernel(folder)
    yield k
