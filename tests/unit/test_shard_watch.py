"""The key that lets a cell's end skip the full look for stepped sharded models, and cells' outcomes on the wire."""
import dataclasses

import torch

from raytrain_nb._internal.errors import RankFailure
from raytrain_nb._internal.worker import shard_watch
from raytrain_nb._internal.worker.outcome import CellOutcome


def test_an_optimizer_step_anywhere_changes_the_count():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    before = shard_watch.steps_taken()
    model(torch.ones(1, 2)).sum().backward()
    opt.step()
    assert shard_watch.steps_taken() == before + 1
    assert shard_watch.steps_taken() == before + 1  # reading it twice installs the hook once


def test_the_shape_follows_the_objects_the_names_hold():
    model, opt = torch.nn.Linear(2, 1), None
    models = {"G": torch.nn.Linear(2, 2)}
    ns = {"model": model, "models": models, "x": 3, "opt": opt}
    shape = shard_watch.namespace_shape(ns)
    ns["x"] = 4  # a plain value holds no model
    assert shard_watch.namespace_shape(ns) == shape
    ns["model"] = torch.nn.Linear(2, 1)  # another object under the name
    assert shard_watch.namespace_shape(ns) != shape
    shape = shard_watch.namespace_shape(ns)
    models["D"] = torch.nn.Linear(2, 2)  # a new model one level down
    assert shard_watch.namespace_shape(ns) != shape
    shape = shard_watch.namespace_shape(ns)

    class Sharded(torch.nn.Linear):
        pass

    ns["model"].__class__ = Sharded  # what fully_shard does to a module, in place
    assert shard_watch.namespace_shape(ns) != shape


def test_an_outcome_crosses_as_a_list_and_comes_back_whole():
    failure = RankFailure(1, "ValueError", "bad", "Traceback ...")
    outcome = CellOutcome(rank=1, failure=failure, value=({"text/plain": "3"}, {}), outputs=[("stdout", "hi\n")],
                          metrics=[{"loss": 0.5}], reports=2, forwards=3, shards_stepped=True, interrupted=True,
                          pg_broken=True, fingerprint={"x": "abc"}, duration=0.25, dead=False, replaced=True)
    wire = outcome.to_wire()
    assert isinstance(wire, list) and len(wire) == len(dataclasses.fields(CellOutcome))
    assert CellOutcome.from_wire(wire) == outcome
