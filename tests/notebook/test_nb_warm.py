"""``%dist_load PATH`` in a real kernel: a trial's checkpoint saved by name loads into the group's same objects.

The sweep itself runs in tests/integration/test_tune_warm.py; here the "winner" is saved in the kernel with
``raytrain_nb.tune.save_state`` (what a trial does), so the test covers the magic, the ``{expr}`` expansion and
its one-line errors.
"""
from __future__ import annotations

import pytest

from ..groups import SETUP
from .nbkernel import START_TIMEOUT_S, usage_error

pytestmark = pytest.mark.notebook

#: In the kernel (the driver): a winner's checkpoint, as a trial saves it, with different weights and lr.
WINNER = """
import tempfile, torch
from raytrain_nb.tune import save_state
_m = torch.nn.Linear(10, 1)
torch.nn.init.constant_(_m.weight, 0.25); torch.nn.init.constant_(_m.bias, -1.0)
_o = torch.optim.SGD(_m.parameters(), lr=0.003, momentum=0.9)
winner = save_state(tempfile.mkdtemp(), model=_m, opt=_o)
"""

#: On every rank: whether the model is the same object and holds the winner's weights and learning rate.
CHECK = """%%distributed
loaded_ok = (id(model) == model_id and bool((model.module.weight == 0.25).all()) and float(model.module.bias) == -1.0
             and opt.param_groups[0]["lr"] == 0.003)
"""


def test_dist_load_puts_a_saved_winner_into_the_groups_objects(kernel):
    kernel.ok("import raytrain_nb as _rt\n_g = _rt.active_group()\nif _g is not None:\n    _g.shutdown()")
    kernel.ok("%%distributed --workers 2" + SETUP, timeout=START_TIMEOUT_S)
    kernel.ok(WINNER)
    cell = kernel.ok("%dist_load {winner.path}")
    assert cell.stdout.startswith("loaded ") and "restored model, opt" in cell.stdout
    kernel.ok(CHECK)
    assert kernel.ok("_rt.active_group().pull('loaded_ok', rank=None)").value == "[True, True]"
    kernel.ok("%%distributed\nloss = model(torch.randn(4, 10)).sum(); opt.zero_grad(); loss.backward(); opt.step()")

    message = usage_error(kernel.run("%dist_load /nonexistent/winner"))
    assert "checkpoint directory /nonexistent/winner does not exist" in message
    kernel.ok("%dist_shutdown")
