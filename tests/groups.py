"""A real worker group for a test module: started, set up, and always shut down."""
from __future__ import annotations

import contextlib
from typing import Iterator

from raytrain_nb import WorkerGroup
from raytrain_nb._internal.output import CollectSink


@contextlib.contextmanager
def set_up_group(setup: str, num_workers: int = 2) -> Iterator[WorkerGroup]:
    """A ``num_workers`` gloo group that has run the cell ``setup``; shut down on exit."""
    g = WorkerGroup(num_workers)
    try:
        g.run(setup, sink=CollectSink())
        yield g
    finally:
        g.shutdown()
