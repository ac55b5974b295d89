"""Magics for the dashboard and background cells: ``%dist_dashboard``, ``%dist_wait``."""
from __future__ import annotations

from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .._internal.errors import GroupError, InterruptTimeout
from .._internal.group.tables import format_status
from . import ui
from .magic_args import need_group


@magics_class
class DashboardMagics(Magics):
    """Look at the group, and wait for its background cell."""

    @magic_arguments()
    @argument("--text", action="store_true", help="status lines instead of widgets (terminals, no-widget front ends)")
    @line_magic
    def dist_dashboard(self, line: str) -> Any:
        """Show the group's dashboard: one row per rank with progress, a live metrics plot, the
        checkpoint list, and buttons that checkpoint, roll back, restart and rescale the group.

        Where widgets cannot be shown (a terminal IPython, or ``RAYTRAIN_NB_UI=text``), the same
        information comes as one status line per report.

        Example::

            In [3]: %dist_dashboard
        """

        args = parse_argstring(self.dist_dashboard, line)
        group = need_group()
        try:
            mode = "text" if args.text else ui.ui_mode()
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if mode == "none":
            raise UsageError(f"{ui.UI_ENV}=none turns the dashboard off: unset it, or use %dist_status")
        ui.show(group, mode)
        if mode == "text":
            print(format_status(group.status()))
            print("raytrain_nb: a status line follows each report (the widget dashboard needs a Jupyter front end)")
        return None

    @line_magic
    def dist_wait(self, line: str) -> None:
        """Wait for the running background cell (``%%distributed --background``) to end.

        Re-raises its error, if it failed. Ctrl-C (the stop button) interrupts the background
        cell on every rank, then waits for it to stop.

        Example::

            In [4]: %%distributed --background
               ...: for step in range(1000): ...

            In [5]: %dist_wait
        """
        group = need_group()
        bg = group.background
        if bg is None:
            raise UsageError("no background cell has run: start one with %%distributed --background")
        try:
            try:
                if not bg.done():
                    print("raytrain_nb: waiting for the background cell (Ctrl-C interrupts it)", flush=True)
                result = bg.wait()  # no deadline: the user waits for their cell; Ctrl-C interrupts it
            except KeyboardInterrupt:  # came before wait() took over: do what it does
                result = bg.stop()
        except (GroupError, InterruptTimeout) as exc:
            raise UsageError(str(exc)) from None
        if result is not None:
            print(f"raytrain_nb: the background cell finished in {result.duration:.1f} s")
