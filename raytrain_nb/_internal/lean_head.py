"""The embedded Ray instance's start without the head processes one machine does not need."""
from __future__ import annotations

import contextlib
from typing import Any, Iterator


@contextlib.contextmanager
def lean_head() -> Iterator[None]:
    """While ``ray.init`` starts the embedded instance: no autoscaler monitor and no log monitor.

    One machine has nothing to autoscale, and with ``log_to_driver=False`` nothing reads what the log
    monitor publishes (cells get their output from the workers themselves). The two are Python processes of
    about 100 MB each and a second or two of CPU at every start: on a 1-CPU, 2 GB Binder pod that counts.
    ``ray start`` has both switches (``--no-monitor``, ``--include-log-monitor``); ``ray.init`` does not pass
    them on, so they are set on the parameters it makes, for this call only.
    """
    from ray._private import parameter  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    original = parameter.RayParams.__init__

    def init(params: Any, *args: Any, **kwargs: Any) -> None:
        original(params, *args, **kwargs)
        params.no_monitor = True
        params.include_log_monitor = False

    parameter.RayParams.__init__ = init
    try:
        yield
    finally:
        parameter.RayParams.__init__ = original
