"""The notebook layer's hooks for the core: a group's dashboard, and the one a ``fit()`` run shows."""
from __future__ import annotations

from typing import Any

from .._internal.frontend import Frontend
from . import ui


def dashboard(group: Any, **options: Any) -> Any:
    """``group``'s widget dashboard (one per group; ``options`` apply the first time)."""
    from .dashboard.view import dashboard_for  # ipywidgets and matplotlib: only when a dashboard is asked for

    return dashboard_for(group, **options)


def show_fit_dashboard(group: Any) -> bool:
    """In a kernel whose UI mode is ``widgets``: show ``group``'s dashboard in the current cell."""
    if ui.ui_mode() != "widgets":
        return False
    return ui.show(group, "widgets") is not None


#: Registered with the core by ``raytrain_nb/__init__.py``.
FRONTEND = Frontend(dashboard=dashboard, show_fit_dashboard=show_fit_dashboard)
