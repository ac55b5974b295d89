"""The embedded Ray instance's start without the head processes one machine does not need."""
from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Iterator, List

from . import settings

#: The script the raylet runs for each Python worker (Ray's ``default_worker.py`` behind a lean start), and
#: that runs Ray's Python head processes (the dashboard head, the dashboard and runtime-env agents).
LEAN_ENTRY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lean_entry.py")


@contextlib.contextmanager
def lean_head() -> Iterator[None]:
    """While ``ray.init`` starts the embedded instance: no autoscaler monitor, no log monitor, lean workers.

    One machine has nothing to autoscale, and with ``log_to_driver=False`` nothing reads what the log
    monitor publishes (cells get their output from the workers themselves). The two are Python processes of
    about 100 MB each and a second or two of CPU at every start: on a 1-CPU, 2 GB Binder pod that counts.
    ``ray start`` has both switches (``--no-monitor``, ``--include-log-monitor``); ``ray.init`` does not pass
    them on, so they are set on the parameters it makes, for this call only. Ray's Python processes start
    through ``lean_entry.py``: its own scripts without a second of needless import (see there). The workers'
    script is a parameter too; the head processes' command starts where Ray puts a memory profiler when asked
    (``RAY_MEMRAY_PROFILE_COMPONENT``, left as it is then). ``RAYTRAIN_NB_LEAN_ENTRY=0`` starts them as Ray does.
    """
    from ray._private import parameter, services  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    lean_entry = settings.lean_entry()
    original = parameter.RayParams.__init__
    original_python = services._build_python_executable_command_memory_profileable

    def init(params: Any, *args: Any, **kwargs: Any) -> None:
        original(params, *args, **kwargs)
        params.no_monitor = True
        params.include_log_monitor = False
        if lean_entry:
            params.worker_path = LEAN_ENTRY

    def head_python(*args: Any, **kwargs: Any) -> List[str]:
        command = list(original_python(*args, **kwargs))
        return command + [LEAN_ENTRY] if lean_entry and command[-1] in (sys.executable, "-u") else command

    parameter.RayParams.__init__ = init
    services._build_python_executable_command_memory_profileable = head_python
    try:
        yield
    finally:
        parameter.RayParams.__init__ = original
        services._build_python_executable_command_memory_profileable = original_python
