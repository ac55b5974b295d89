"""What the group dashboard and the sweep dashboard share to show values: a metric's number, a state badge, a row cell.

The plain-data models (``dashboard/model.py``, ``sweep/model.py``) use :func:`finite_number`, the widget views the
rest; importing this module loads no widgets (a terminal's text dashboard needs none).
"""
from __future__ import annotations

import html
import math
from typing import TYPE_CHECKING, Any, Mapping, Optional

if TYPE_CHECKING:
    import ipywidgets

#: A badge's colour for a state its table of colours does not list.
OTHER_COLOUR = "#6c757d"


def finite_number(value: Any) -> Optional[float]:
    """``value`` as a finite float, or None (bools, strings, NaN and infinities are not metrics)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def state_badge(state: str, colours: Mapping[str, str]) -> str:
    """``state`` as a coloured pill (HTML), in its colour from ``colours`` (grey for a state not listed)."""
    colour = colours.get(state, OTHER_COLOUR)
    return (f'<span style="background:{colour};color:white;padding:1px 8px;border-radius:9px;'
            f'font-size:12px">{html.escape(state)}</span>')


def row_cell(width: str, value: str = "") -> "ipywidgets.HTML":
    """One cell of a table row: an HTML widget ``width`` wide (and never narrower), holding ``value``."""
    import ipywidgets as w  # ipywidgets: only the widget views make cells; the models import this module too

    return w.HTML(value=value, layout=w.Layout(width=width, min_width=width, margin="0 4px 0 0"))
