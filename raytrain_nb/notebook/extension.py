"""``%load_ext raytrain_nb``: register every magic, let Ray start our embedded instance, and stop the group and
our Ray with the kernel."""
from __future__ import annotations

import logging
from typing import Any

from .._internal import cluster
from .._internal.group.group import active_group
from .._internal.train.trainer import install_autoinit
from .magics import DistributedMagics
from .magics_attach import AttachMagics
from .magics_dashboard import DashboardMagics
from .magics_debug import DebugMagics
from .magics_state import StateMagics

logger = logging.getLogger(__name__)


def stop_on_kernel_shutdown(ipython: Any) -> None:
    """Shut the group and the Ray instance we started down when the kernel shuts down (a keep-alive group is
    detached instead: it lives on for its keep-alive, and ``%dist_attach`` in the next kernel takes it over).

    Without it the kernel waits on Ray's processes until the kernel manager kills it (~5 s).
    """
    kernel = getattr(ipython, "kernel", None)
    original = getattr(kernel, "do_shutdown", None)
    if original is None or getattr(original, "_rtnb", False):
        return

    def do_shutdown(restart: bool) -> Any:
        try:
            group = active_group()
            if group is not None and group.keep_alive > 0:
                group.detach()
            elif group is not None:
                group.shutdown()
            if cluster.started_by_us():
                import ray  # loaded already: our Ray instance is running

                ray.shutdown()
        except Exception as exc:  # noqa: BLE001 - the kernel must shut down regardless
            logger.warning("stopping Ray at kernel shutdown: %s", exc)
        return original(restart)

    do_shutdown._rtnb = True  # type: ignore[attr-defined]
    kernel.do_shutdown = do_shutdown


def load_ipython_extension(ipython: Any) -> None:
    """Register the magics of :mod:`.magics`, :mod:`.magics_state`, :mod:`.magics_dashboard`, :mod:`.magics_debug`,
    :mod:`.magics_attach`."""
    stop_on_kernel_shutdown(ipython)
    # Ray Data in a cell (ray.data.range(...)) before the first group starts our embedded instance, sized
    # for the container, not Ray's default one, which would leave no CPU for Ray Data beside the workers.
    install_autoinit()
    for magics in (DistributedMagics, StateMagics, DashboardMagics, DebugMagics, AttachMagics):
        ipython.register_magics(magics)


def unload_ipython_extension(ipython: Any) -> None:
    """Nothing to undo: the magics stay until the kernel ends."""
