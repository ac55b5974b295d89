"""Which dashboard a front end gets: widgets in a Jupyter kernel, text lines elsewhere.

``RAYTRAIN_NB_UI`` chooses: ``auto`` (default), ``widgets``, ``text`` or ``none``. With ``auto``,
a Jupyter kernel (``get_ipython()`` has a ``kernel``: JupyterLab, Notebook 7, VS Code, nbclient)
gets the widget dashboard when ipywidgets imports; anything else (terminal IPython, a script)
gets the text fallback. A kernel cannot tell whether its front end renders widgets: in one that
does not (``jupyter console``), set ``RAYTRAIN_NB_UI=text``.
"""
from __future__ import annotations

import logging
from typing import Any, Optional

from .._internal import settings
from .dashboard.text import existing_reporter, reporter_for

logger = logging.getLogger(__name__)

UI_ENV = settings.UI.name
MODES = ("auto", "widgets", "text", "none")


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (``get_ipython()`` has a ``kernel``)."""
    try:
        from IPython import get_ipython  # IPython: only inside a kernel
    except ImportError:  # pragma: no cover - IPython is a dependency
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


def ui_mode() -> str:
    """``widgets``, ``text`` or ``none`` for this process.

    Raises:
        ValueError: ``RAYTRAIN_NB_UI`` has an unknown value (names the allowed ones).
    """
    mode = settings.ui()
    if mode not in MODES:
        raise ValueError(f"{UI_ENV}={mode!r} is unknown: use one of {', '.join(MODES)}")
    if mode != "auto":
        return mode
    if not in_kernel():
        return "text"
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return "text"
    return "widgets"


def show(group: Any, mode: Optional[str] = None) -> Any:
    """Show ``group``'s dashboard in the current cell (widgets) or start its status lines (text).

    Returns:
        The :class:`~raytrain_nb.notebook.widgets.Dashboard`, the
        :class:`~raytrain_nb.notebook.textui.TextReporter`, or None with mode ``none``.
    """
    mode = mode or ui_mode()
    if mode == "none":
        return None
    if mode == "text":
        return reporter_for(group)
    from IPython.display import display  # IPython: only inside a kernel

    from .dashboard.view import dashboard_for  # ipywidgets: only when the widget dashboard is shown

    dash = dashboard_for(group)
    display(dash)
    return dash


def expect_steps(group: Any, total: Optional[int]) -> None:
    """``--steps N``: the total of the next cell's progress bars, for every view of ``group``."""
    views = [existing_reporter(group)]
    try:
        from .dashboard.view import existing_dashboard  # ipywidgets: optional (ImportError below)

        dash = existing_dashboard(group)
        views.append(dash.model if dash is not None else None)
    except ImportError:  # no ipywidgets: text only
        pass
    for view in views:
        if view is not None:
            view.expect_steps(total)
