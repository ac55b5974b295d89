"""Jupyter's stop button (a SIGINT to the kernel) while ranks train a DDP model."""
from __future__ import annotations

import re

import pytest

from .nbkernel import START_TIMEOUT_S

# exclusive: timing bounds; the other test lane waits (tests/lanes.py)
pytestmark = [pytest.mark.notebook, pytest.mark.exclusive]

#: From the interrupt to the cell's reply (the requirement; not loosened for a loaded machine).
STOP_S = 2.0

SETUP = """\
import torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
rank = train.get_context().get_world_rank()
torch.manual_seed(0)
model = prepare_model(torch.nn.Sequential(torch.nn.Linear(10, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1)))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
model_id = id(model)

def train_steps(n):
    for _ in range(n):
        loss = model(torch.randn(16, 10)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    return loss.item()
"""

TRAIN_ON = """\
%%distributed --output all
last = train_steps(20)
params = [p.detach().clone() for p in model.parameters()]
print(id(model) == model_id, type(model).__name__)
"""


@pytest.fixture(scope="module")
def nb(kernel):
    kernel.ok(f"%%distributed --workers 2\n{SETUP}", timeout=START_TIMEOUT_S)
    kernel.ok("import torch")
    return kernel


def _trains_normally(nb) -> None:
    """The next cell trains the same model object on both ranks, and their replicas stay identical."""
    cell = nb.ok(TRAIN_ON)
    assert sorted(cell.stdout.splitlines()) == ["[rank 0] True DistributedDataParallel",
                                                "[rank 1] True DistributedDataParallel"]
    same = nb.ok("%dist_pull params --all\n"
                 "all(torch.equal(a, b) for a, b in zip(*params)), len(params), len(params[0])")
    assert same.value == "(True, 2, 4)", same.value


def _stopped_in_time(nb, cell, sent: float) -> str:
    nb.finish(cell, timeout=60)
    took = cell.received_t - sent
    assert took < STOP_S, f"the cell took {took:.2f} s to stop after the interrupt:\n{cell.describe()}"
    assert cell.status == "error"
    text = cell.error_text
    assert "KeyboardInterrupt" in text, text
    return text


def test_interrupt_stops_a_training_loop_and_the_model_trains_on(nb):
    cell = nb.submit("""\
%%distributed
train_steps(2)
print("training", flush=True)
step = 0
while True:
    train_steps(1)
    step += 1
""")
    nb.wait_for(cell, lambda m: m.type == "stream" and "training" in m.content["text"])
    text = _stopped_in_time(nb, cell, nb.interrupt())
    assert re.search(r'File "<cell-\d+>", line \d+, in <module>', text), text
    _trains_normally(nb)


def test_interrupt_releases_a_rank_blocked_in_the_ddp_allreduce(nb):
    cell = nb.submit("""\
%%distributed --output all
if rank == 1:
    print("spinning", flush=True)
    while True:  # never calls backward: rank 0's allreduce waits for it
        pass
else:
    loss = model(torch.randn(16, 10)).pow(2).mean()
    print("backward", flush=True)
    loss.backward()
    print("backward returned")
""")
    nb.wait_for(cell, lambda m: "[rank 0] backward" in cell.stdout and "[rank 1] spinning" in cell.stdout)
    text = _stopped_in_time(nb, cell, nb.interrupt())
    assert "backward returned" not in cell.stdout
    # Both ranks stopped where they were: rank 0 in backward, rank 1 in its loop.
    blocks = dict(re.findall(r"^\[rank (\d)\][^\n]*\n(.*?)(?=^\[rank |\Z)", text, re.M | re.S))
    assert set(blocks) == {"0", "1"}, text
    assert "loss.backward()" in blocks["0"], text
    assert re.search(r"while True|pass", blocks["1"]), text
    _trains_normally(nb)
