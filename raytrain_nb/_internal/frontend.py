"""Hooks through which the core shows a dashboard without importing the notebook layer.

The core offers the hook; the layer above registers itself, as the output sink does
(:class:`~raytrain_nb._internal.output.OutputSink`). ``raytrain_nb/__init__.py`` registers the
notebook layer's hooks, so they are there whenever the package is imported; without them
(``register(None)``, or a build without the notebook layer) ``group.dashboard()`` says what
is missing and ``fit()`` shows text progress.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any, Callable, Optional

from .errors import GroupError

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class Frontend:
    """What a front end offers the core.

    Attributes:
        dashboard: ``dashboard(group, **options)`` returns the group's live dashboard (a value
            that renders itself when it is a cell's value).
        show_fit_dashboard: ``show_fit_dashboard(group)`` shows the dashboard for a ``fit()`` run
            in the current cell; False when this front end shows none (text progress then).
    """

    dashboard: Callable[..., Any]
    show_fit_dashboard: Callable[[Any], bool]


_FRONTEND: Optional[Frontend] = None


def register(frontend: Optional[Frontend]) -> None:
    """Install ``frontend`` (None removes it)."""
    global _FRONTEND
    _FRONTEND = frontend


def dashboard(group: Any, **options: Any) -> Any:
    """``group``'s dashboard from the registered front end.

    Raises:
        GroupError: no front end is registered.
    """
    if _FRONTEND is None:
        raise GroupError("no dashboard front end is registered: import raytrain_nb (it registers the notebook's "
                         "widgets), or use %dist_status / group.status() for a text table")
    return _FRONTEND.dashboard(group, **options)


def show_fit_dashboard(group: Any) -> bool:
    """Show a ``fit()`` run's dashboard if a front end can; False means text progress instead."""
    if _FRONTEND is None:
        return False
    try:
        return bool(_FRONTEND.show_fit_dashboard(group))
    except Exception:  # noqa: BLE001 - the run goes on with text progress
        logger.warning("the dashboard could not be shown; showing text progress", exc_info=True)
        return False
