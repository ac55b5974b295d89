from __future__ import annotations

import pytest

from ..groups import set_up_group

SETUP = """
import torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
torch.manual_seed(0)
rank = train.get_context().get_world_rank()
model = prepare_model(torch.nn.Linear(10, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model_id = id(model)
"""

STEP = """
loss = model(torch.randn(32, 10)).pow(2).mean()
opt.zero_grad(); loss.backward(); opt.step()
"""

PARAMS = "[p.detach().clone() for p in model.parameters()]"


@pytest.fixture(scope="module")
def group(ray_session):
    """A 2-worker gloo group with a DDP model, shared by a module's tests."""
    with set_up_group(SETUP) as g:
        yield g


def rank_params(g):
    """Each rank's model parameters, as CPU tensors (pulled from the workers)."""
    return [[p.detach() for p in m.parameters()] for m in g.pull("model", rank=None)]
