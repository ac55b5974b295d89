"""Output of a background cell goes to that cell's own output area, not the one running now.

ipykernel tags every output message with a *parent header*: the request of the cell it belongs
to, which is how a front end knows where to show it. The parent is looked up when the message is
sent. In ipykernel >= 6.29 it is a ``ContextVar`` with a process-wide fallback: a thread that never
set its own gets the global value, which is the cell executing *now*. So a background cell's
thread would write into whichever cell happens to run later.

:class:`CellRoute` captures the originating cell's parent when the magic runs and, in each thread
that writes for that cell, sets it as that thread's own parent (``shell.set_thread_parent`` in
ipykernel >= 7, the streams' and display publisher's ``ContextVar`` before). The global fallback
is never changed, so the foreground cell's output stays where it belongs. JupyterLab keeps
accepting output for a cell until the cell runs again.
"""
from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Dict, Optional

from .sink import MimeBundle, NotebookSink

logger = logging.getLogger(__name__)


def _shell() -> Any:
    try:
        from IPython import get_ipython  # IPython: only inside a kernel
    except ImportError:  # pragma: no cover - IPython is a dependency
        return None
    return get_ipython()


def current_parent() -> Optional[Dict[str, Any]]:
    """The request (message) the kernel is handling in this thread, or None outside a kernel."""
    shell = _shell()
    kernel = getattr(shell, "kernel", None)
    if kernel is None or not hasattr(kernel, "get_parent"):
        return None
    try:
        parent = kernel.get_parent()
    except Exception:  # noqa: BLE001 - no parent yet
        return None
    return parent or None


class CellRoute:
    """Where the output of the cell that created this object goes, from any thread.

    Outside a kernel (terminal IPython, plain Python) it does nothing: output goes to the
    process's stdout, as usual.
    """

    def __init__(self) -> None:
        self.shell = _shell()
        self.parent = current_parent()
        self._local = threading.local()

    @property
    def active(self) -> bool:
        return self.parent is not None

    def enter(self) -> None:
        """Route this thread's output (print, display, errors) to the originating cell (idempotent)."""
        if self.parent is None or getattr(self._local, "entered", False):
            return
        self._local.entered = True
        setter = getattr(self.shell, "set_thread_parent", None)
        if setter is not None:
            setter(self.parent)
            return
        header = self.parent.get("header", self.parent)
        for obj in (sys.stdout, sys.stderr, getattr(self.shell, "display_pub", None),
                    getattr(self.shell, "displayhook", None)):
            var = getattr(obj, "_parent_header", None)
            if hasattr(var, "set"):  # ipykernel 6.29-6.x: a ContextVar, per thread
                var.set(header)
            else:
                logger.debug("this ipykernel cannot route thread output to a cell: it goes to the latest cell")


class BackgroundSink(NotebookSink):
    """A :class:`NotebookSink` that writes into its cell's output area from the background thread."""

    def __init__(self, route: CellRoute) -> None:
        super().__init__()
        self.route = route

    def stream(self, rank: int, name: str, text: str, label: bool) -> None:
        self.route.enter()
        super().stream(rank, name, text, label)

    def display(self, rank: int, data: Dict[str, Any], metadata: Dict[str, Any], label: bool) -> None:
        self.route.enter()
        super().display(rank, data, metadata, label)

    def value(self, rank: int, data: Dict[str, Any], metadata: Dict[str, Any], label: bool) -> None:
        """The cell's value is shown when it arrives (the cell returned long ago: no ``Out[n]``)."""
        self.route.enter()
        if label:
            super().value(rank, data, metadata, label)
        else:
            from IPython.display import display  # IPython: only inside a kernel

            display(MimeBundle(data, metadata))

    def notice(self, text: str) -> None:
        self.route.enter()
        super().notice(text)
