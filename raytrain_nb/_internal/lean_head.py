"""The embedded Ray instance's start without the head processes one machine does not need."""
from __future__ import annotations

import contextlib
import os
from typing import Any, Iterator

#: The script the raylet runs for each Python worker (Ray's ``default_worker.py`` behind a lean start).
LEAN_WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lean_worker.py")


@contextlib.contextmanager
def lean_head() -> Iterator[None]:
    """While ``ray.init`` starts the embedded instance: no autoscaler monitor, no log monitor, lean workers.

    One machine has nothing to autoscale, and with ``log_to_driver=False`` nothing reads what the log
    monitor publishes (cells get their output from the workers themselves). The two are Python processes of
    about 100 MB each and a second or two of CPU at every start: on a 1-CPU, 2 GB Binder pod that counts.
    ``ray start`` has both switches (``--no-monitor``, ``--include-log-monitor``); ``ray.init`` does not pass
    them on, so they are set on the parameters it makes, for this call only. The raylet starts its Python
    workers through ``lean_worker.py``: Ray's own worker without a second of needless import (see there).
    """
    from ray._private import parameter  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    original = parameter.RayParams.__init__

    def init(params: Any, *args: Any, **kwargs: Any) -> None:
        original(params, *args, **kwargs)
        params.no_monitor = True
        params.include_log_monitor = False
        params.worker_path = LEAN_WORKER

    parameter.RayParams.__init__ = init
    try:
        yield
    finally:
        parameter.RayParams.__init__ = original
