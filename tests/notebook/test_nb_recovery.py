"""The named regression of a notebook's most common first cell, through a real kernel's magics.

A first cell that builds a DDP model and trains it; a training cell during which rank 1's process is
SIGKILLed; ``%dist_restart``; a short training cell; ``%dist_rescale 1``; a training cell;
``%dist_rescale 2``; a training cell. Every step has a deadline (a hang fails the test, not the suite),
and in the end both ranks hold equal parameters and optimizer state.
"""
from __future__ import annotations

import os
import signal

import pytest

from ..groups import FIRST_CELL as GROUP_FIRST_CELL
from .nbkernel import START_TIMEOUT_S

pytestmark = pytest.mark.notebook
#: a kernel of its own (tests/notebook/conftest.py): its first cell starts Ray as well, as in a new notebook
FRESH_KERNEL = True

FIRST_CELL = "%%distributed --workers 2" + GROUP_FIRST_CELL

#: Each rank's parameters and momentum, as one digest.
DIGEST = """%%distributed
import hashlib
_h = hashlib.sha1(b"".join(t.detach().cpu().numpy().tobytes() for t in
                           [*model.parameters(), *(s['momentum_buffer'] for s in opt.state.values())])).hexdigest()
"""
#: Deadline of each recovery step (the regression hung for more than seven minutes).
RECOVER_S = 120


def test_first_cell_trains_then_kill_restart_rescale_1_2_in_a_kernel(kernel):
    kernel.ok("import raytrain_nb as _rt\n_g = _rt.active_group()\nif _g is not None:\n    _g.shutdown()")
    kernel.ok(FIRST_CELL, timeout=START_TIMEOUT_S)
    pid = int(kernel.ok("_rt.active_group().status()[1].pid").value)
    cell = kernel.submit("%%distributed\nprint('training', flush=True)\nwhile True:\n    steps(1)")
    kernel.wait_for(cell, lambda m: m.type == "stream" and "training" in m.content["text"])
    os.kill(pid, signal.SIGKILL)
    kernel.finish(cell, timeout=60)
    assert cell.status == "error" and "rank 1" in cell.error_text and "died" in cell.error_text
    kernel.ok("%dist_restart", timeout=RECOVER_S)
    kernel.ok("%%distributed\nsteps(3)")
    kernel.ok("%dist_rescale 1", timeout=RECOVER_S)
    kernel.ok("%%distributed\nsteps(3)")
    kernel.ok("%dist_rescale 2", timeout=RECOVER_S)
    kernel.ok("%%distributed\nsteps(3)")
    kernel.ok(DIGEST)
    digests = kernel.ok("_d = _rt.active_group().pull('_h', rank=None)\n_d").value
    assert kernel.ok("len(_d) == 2 and _d[0] == _d[1]").value == "True", digests
    kernel.ok("%dist_shutdown")
