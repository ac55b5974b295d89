"""The dashboard's Where button: every rank's stack now (``group.where()``, the call ``%dist_where`` makes).

A click is a message to the kernel: between cells and during ``--background`` cells it is handled at once. During
a foreground cell the kernel handles it only where the front end sends it on a subshell of its own (JupyterLab
4.4 or later with ipykernel 7); elsewhere it waits until the cell ends, and the tooltip says so (the quiet-cell
notice then tells where the ranks are, unprompted).
"""
from __future__ import annotations

import html
import logging
import time
from typing import Any

import ipywidgets as w

logger = logging.getLogger(__name__)

TOOLTIP = ("where every rank's code is now, ranks with the same stack grouped (%dist_where). Answered at once "
           "between cells and during --background cells; during a foreground cell only where the front end sends the "
           "click on a kernel subshell (JupyterLab >= 4.4 with ipykernel 7), else once the cell ended")


class WherePanel:
    """The Where button and the text it shows (``box``)."""

    def __init__(self, group: Any) -> None:
        self.group = group
        self.button = w.Button(description="Where", icon="search", tooltip=TOOLTIP,
                               layout=w.Layout(width="auto", margin="2px 4px 2px 0"))
        self.button.add_class("rtnb-btn-where")
        self.output = w.HTML(value="")
        self.output.add_class("rtnb-where")
        self.button.on_click(lambda _button: self.press())
        self.box = w.VBox([self.button, self.output])

    def press(self) -> str:
        """Ask every rank where it is and show it; returns the text shown."""
        try:
            text = str(self.group.where())
        except Exception as exc:  # noqa: BLE001 - shown in the panel, never raised into the kernel log unseen
            logger.warning("dashboard: Where failed: %s", exc, exc_info=True)
            text = f"cannot tell where the ranks are: {(str(exc).splitlines() or [type(exc).__name__])[0]}"
        self.output.value = (f'<pre style="margin:2px 0;font-size:12px">{time.strftime("%H:%M:%S")} '
                             f"{html.escape(text)}</pre>")
        return text
