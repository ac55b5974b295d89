"""What tests that use a real worker group share: starting one, quiet runs, output markers, parameters, and the one
check that every rank holds the same state."""
from __future__ import annotations

import contextlib
import sys
import threading
from typing import Any, Iterator, List, Mapping, Optional, Sequence

from raytrain_nb import WorkerGroup
from raytrain_nb._internal.output import CollectSink

#: A DDP model and its optimizer on every rank (the setup cell most tests start from).
SETUP = """
import torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
torch.manual_seed(0)
rank = train.get_context().get_world_rank()
model = prepare_model(torch.nn.Linear(10, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
model_id = id(model)
"""

#: The most common first cell of a notebook (issue 13's regression): build a DDP model and train it a few steps.
FIRST_CELL = """
import os, time, torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
torch.manual_seed(0)
model = prepare_model(torch.nn.Linear(16, 4))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
def steps(n):
    for _ in range(n):
        loss = model(torch.randn(8, 16)).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
steps(10)
"""

#: One training step of the model in :data:`SETUP`.
STEP = """
loss = model(torch.randn(32, 10)).pow(2).mean()
opt.zero_grad(); loss.backward(); opt.step()
"""


@contextlib.contextmanager
def pickled_by_value(module: Any) -> Iterator[Any]:
    """Ray sends ``module``'s functions by value meanwhile: workers and trial actors need not import the tests
    package to run them."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(module)
    try:
        yield module
    finally:
        ray.cloudpickle.unregister_pickle_by_value(module)


@contextlib.contextmanager
def set_up_group(setup: str, num_workers: int = 2, **options: Any) -> Iterator[WorkerGroup]:
    """A ``num_workers`` gloo group that has run the cell ``setup``; shut down on exit."""
    g = WorkerGroup(num_workers, **options)
    try:
        g.run(setup, sink=CollectSink())
        yield g
    finally:
        g.shutdown()


def quiet(group: WorkerGroup, source: str, **options: Any) -> Any:
    """``group.run(source)`` with its output collected, not printed."""
    return group.run(source, sink=CollectSink(), **options)


def each_rank(group: WorkerGroup, expr: str) -> List[Any]:
    """The value of ``expr`` on every rank, in rank order."""
    quiet(group, f"_v = {expr}")
    return group.pull("_v", rank=None)


def rank_params(group: WorkerGroup, name: str = "model") -> List[List[Any]]:
    """Each rank's parameters of the model bound to ``name``, as CPU tensors (pulled from the workers)."""
    return [[p.detach() for p in m.parameters()] for m in group.pull(name, rank=None)]


class MarkerSink(CollectSink):
    """Collects output; ``seen`` is set once ``marker`` appears in it (or a notice, with ``on_notice``)."""

    def __init__(self, marker: str = "training", on_notice: bool = False) -> None:
        super().__init__()
        self.marker = marker
        self.on_notice = on_notice
        self.seen = threading.Event()

    def stream(self, rank: int, name: str, text: str, label: bool) -> None:
        super().stream(rank, name, text, label)
        if self.marker in text:
            self.seen.set()

    def notice(self, text: str) -> None:
        super().notice(text)
        if self.on_notice:
            self.seen.set()


def state_difference(a: Any, b: Any, where: str = "") -> Optional[str]:
    """Where two pulled states differ, or None when they are equal.

    Tensors (torch) and arrays (numpy, or anything with a shape and a dtype) compare by shape and value, mappings by
    keys then value, lists and tuples by length then item, anything else with ``==``. ``where`` names the place
    (``[0][3]``, ``['model']['weight']``) in the answer.
    """
    at = where or "the top"
    torch, numpy = sys.modules.get("torch"), sys.modules.get("numpy")  # loaded by whatever made a tensor or an array
    if torch is not None and (isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor)):
        same = isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and torch.equal(a, b)
        return None if same else f"{at}: tensors differ"
    if numpy is not None and all(hasattr(x, "shape") and hasattr(x, "dtype") for x in (a, b)):
        return None if numpy.array_equal(numpy.asarray(a), numpy.asarray(b)) else f"{at}: arrays differ"
    if isinstance(a, Mapping) and isinstance(b, Mapping):
        if a.keys() != b.keys():
            return f"{at}: keys {sorted(map(str, a))} against {sorted(map(str, b))}"
        return next((d for k in a for d in [state_difference(a[k], b[k], f"{where}[{k!r}]")] if d), None)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return f"{at}: {len(a)} items against {len(b)}"
        return next((d for i, (x, y) in enumerate(zip(a, b)) for d in [state_difference(x, y, f"{where}[{i}]")] if d),
                    None)
    return None if a == b else f"{at}: {a!r} against {b!r}"


def same_state(a: Any, b: Any) -> bool:
    """Whether two pulled states are equal (see :func:`state_difference`)."""
    return state_difference(a, b) is None


def assert_ranks_identical(per_rank: Sequence[Any], what: str = "state") -> None:
    """Every rank's pulled ``what`` (parameters, optimizer state, step: any nesting) equals rank 0's."""
    assert len(per_rank) >= 1, f"no rank's {what} to compare"
    for rank, other in enumerate(per_rank[1:], start=1):
        difference = state_difference(per_rank[0], other)
        assert difference is None, f"rank {rank}'s {what} differs from rank 0's at {difference}"
