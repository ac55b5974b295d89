"""What a new rank receives from a peer: the plan (which names), the pickle (shared references kept,
its own objects referenced), the walk that names nested objects, and the cells' definitions replayed."""
from __future__ import annotations

import threading

import pytest
import torch

from raytrain_nb._internal.worker import transfer
from raytrain_nb._internal.worker.cell import definitions
from raytrain_nb._internal.worker.replicate import plan_transfer
from raytrain_nb._internal.worker.snapshot import find_tracked

SOURCE = """
import torch
class Box:
    pass
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
loss = model(torch.randn(3, 4)).sum(); opt.zero_grad(); loss.backward(); opt.step()
box = Box(); box.opt = opt
nets = {'g': torch.nn.Linear(2, 2)}
def scaled(x):
    return model(x) * factor
factor = 2.0
"""


def namespace(source=SOURCE):
    ns = {"__name__": "__main__"}
    exec(source, ns)
    return ns


def test_the_walk_names_nested_objects_by_the_path_a_user_writes():
    tracked = find_tracked(namespace())
    assert sorted(tracked.modules) == ["model", "nets['g']"]
    assert sorted(tracked.optimizers) == ["opt"]  # box.opt is the same optimizer: one path, the shortest


def test_plan_sends_what_a_fresh_rank_lacks_or_holds_otherwise_and_keeps_the_rest():
    src = {"structure": {"model": "a", "opt": "b", "torch": "t", "rank": "r", "lr": "x"}, "fresh": False}
    fresh = {"structure": {"model": "OTHER", "torch": "t"}, "fresh": True}
    send, keep, cannot = plan_transfer([src, fresh], 0, rank_specific=["rank"])
    assert send == ["lr", "model", "opt"] and keep == ["torch"] and cannot == ["rank"]


def test_a_fresh_rank_gets_objects_that_share_its_own_parameters_and_live_in_its_namespace():
    peer = namespace()
    mine = namespace("import torch\nclass Box:\n    pass\nmodel = torch.nn.Linear(4, 2)\n")
    keep = ["Box", "model", "torch"]
    payload, problems = transfer.pack(peer, ["opt", "box", "nets", "scaled", "factor"],
                                      transfer.reference_tokens(peer, keep, {}))
    assert not problems
    got = transfer.unpack(payload, mine, keep, {}, deferred_ddp=None)
    mine.update(got)
    # The optimizer optimizes this rank's own model (a reference, not a copy), with the peer's momentum.
    assert all(p is q for p, q in zip(mine["opt"].param_groups[0]["params"], mine["model"].parameters()))
    assert mine["opt"].state_dict()["state"][0]["momentum_buffer"].equal(peer["opt"].state_dict()["state"][0]["momentum_buffer"])
    assert mine["box"].opt is mine["opt"] and isinstance(mine["box"], mine["Box"])  # this rank's own class
    # A function defined in a cell reads the namespace it landed in.
    assert mine["scaled"].__globals__ is mine
    x = torch.randn(1, 4)
    assert torch.equal(mine["scaled"](x), mine["model"](x) * 2.0)


def test_a_name_that_cannot_be_pickled_is_named_with_why():
    peer = namespace()
    peer["lock"] = threading.Lock()
    payload, problems = transfer.pack(peer, ["opt", "lock"], {})
    assert payload == b"" and list(problems) == ["lock"] and "pickle" in problems["lock"]


def test_plain_values_are_never_sent_as_references():
    peer = {"__name__": "__main__", "epoch": 3, "history": [3, 3]}
    mine = {"__name__": "__main__", "epoch": 0}
    payload, _ = transfer.pack(peer, ["history"], transfer.reference_tokens(peer, ["epoch"], {}))
    assert transfer.unpack(payload, mine, ["epoch"], {}, None)["history"] == [3, 3]


@pytest.mark.parametrize("source, kept", [
    ("import os\nx = 1\ndef f():\n    return x\nf()\n", "import os\n\ndef f():\n    return x\n\n"),
    ("@staticmethod\ndef g():\n    pass\nclass C:\n    y = 2\nprint(1)\n", "@staticmethod\ndef g():\n    pass\nclass C:\n    y = 2\n\n"),
    ("x = 1\nx += 1\n", ""),
    ("def broken(:\n", ""),
])
def test_definitions_keep_imports_functions_and_classes_at_their_lines(source, kept):
    assert definitions(source) == kept
