"""Rich output on a worker: values, ``display(...)`` and matplotlib figures as mime bundles.

A minimal IPython shell is created lazily (only when a cell uses IPython
syntax or ``display``), with a display publisher that appends to the running
cell's output buffer. Without it, values are rendered with their ``_repr_*_``
methods.
"""
from __future__ import annotations

import base64
import io
import sys
from typing import Any, Callable, Dict, Optional, Tuple

Bundle = Tuple[Dict[str, Any], Dict[str, Any]]

_REPR_METHODS = (
    ("_repr_html_", "text/html"),
    ("_repr_markdown_", "text/markdown"),
    ("_repr_latex_", "text/latex"),
    ("_repr_svg_", "image/svg+xml"),
    ("_repr_png_", "image/png"),
    ("_repr_jpeg_", "image/jpeg"),
)


class WorkerDisplay:
    """Formats values and publishes display data into the active buffer."""

    def __init__(self, namespace: Dict[str, Any], sink: Callable[[Dict[str, Any], Dict[str, Any]], None]) -> None:
        self._namespace = namespace
        self._sink = sink
        self.shell: Any = None

    def ensure_shell(self) -> Any:
        """Create the worker's IPython shell on first need; bind ``get_ipython``."""
        if self.shell is not None:
            return self.shell
        from IPython.core.displaypub import DisplayPublisher  # IPython: only for cells that use it
        from IPython.core.interactiveshell import InteractiveShell  # IPython: only for cells that use it
        from traitlets.config import Config  # traitlets: optional or heavy, loaded on first use

        sink = self._sink

        class _Publisher(DisplayPublisher):
            def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kw):
                sink(data, metadata or {})

            def clear_output(self, wait=False):
                pass

        cfg = Config()
        cfg.HistoryManager.enabled = False
        cfg.InteractiveShell.colors = "NoColor"
        shell = InteractiveShell.instance(config=cfg, user_ns=self._namespace)
        shell.display_pub = _Publisher(shell=shell)
        self.shell = shell
        return shell

    def display(self, *objs: Any, **kwargs: Any) -> None:
        """``display(...)`` for worker code: the IPython function, published to the notebook."""
        self.ensure_shell()
        from IPython.display import display as ipy_display  # IPython: only for cells that use it

        ipy_display(*objs, **kwargs)

    def format(self, value: Any) -> Optional[Bundle]:
        """Render a value to a mime bundle (on the worker, so no CUDA tensor travels)."""
        if value is None:
            return None
        if self.shell is not None:
            data, md = self.shell.display_formatter.format(value)
            return data, md
        data: Dict[str, Any] = {"text/plain": repr(value)}
        for method, mime in _REPR_METHODS:
            fn = getattr(value, method, None)
            if callable(fn) and not isinstance(value, type):
                try:
                    rendered = fn()
                except Exception:
                    continue
                if rendered is None:
                    continue
                if isinstance(rendered, bytes):
                    rendered = base64.b64encode(rendered).decode("ascii")
                data[mime] = rendered
        return data, {}

    def flush_figures(self) -> None:
        """Publish every open matplotlib figure as a PNG and close it (like the inline backend)."""
        plt = sys.modules.get("matplotlib.pyplot")
        if plt is None:
            return
        for num in plt.get_fignums():
            fig = plt.figure(num)
            buf = io.BytesIO()
            fig.savefig(buf, format="png", bbox_inches="tight")
            self._sink(
                {"image/png": base64.b64encode(buf.getvalue()).decode("ascii"), "text/plain": repr(fig)},
                {},
            )
        plt.close("all")
