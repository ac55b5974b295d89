"""Running a ``%%distributed`` cell: in the foreground, in the background, or queued behind one.

``--background`` returns at once; the cell's output keeps going into its own output area (see
:mod:`.routing`), and when it ends its error, if any, is shown there too. ``%dist_wait``
re-raises it. While it runs, ``%dist_status``, ``%dist_checkpoint``, ``%dist_pull`` and
``%dist_interrupt`` work; other magics, and another ``%%distributed`` cell, are refused with a
message, unless that cell says ``--queue``: it then waits for the background cell to end and
runs after it (not at all if the background cell failed).
"""
from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Optional

from IPython.core.error import UsageError

from .._internal.errors import GroupError, RaytrainNbError, WorkerError
from .routing import BackgroundSink, CellRoute
from .magics_debug import ask
from .sink import NotebookSink
from .ui import expect_steps

logger = logging.getLogger(__name__)

QUEUE_POLL_S = 0.05


def running_background(group: Any) -> Optional[Any]:
    """The group's background cell while it runs, else None."""
    bg = getattr(group, "background", None)
    return bg if bg is not None and not bg.done() else None


def wait_in_queue(group: Any) -> None:
    """``--queue``: wait for the running background cell; Ctrl-C gives up (the background cell goes on).

    Raises:
        UsageError: the background cell failed (so this cell does not run), or the wait was interrupted.
    """
    bg = running_background(group)
    if bg is None:
        return
    pause = threading.Event()
    try:
        print("raytrain_nb: queued behind the background cell (Ctrl-C gives up on this cell)", flush=True)
        while not bg.done():
            pause.wait(QUEUE_POLL_S)
    except KeyboardInterrupt:
        raise UsageError("interrupted while queued: this cell did not run; the background cell goes on "
                         "(%dist_interrupt stops it)") from None
    if bg.error is not None:
        raise UsageError(f"not run: the background cell it was queued behind failed "
                         f"({type(bg.error).__name__}; its output shows the error, %dist_wait re-raises it)")


def run_cell(group: Any, cell: str, args: Any, ranks: Any) -> Any:
    """Run ``cell`` as ``%%distributed`` with the parsed ``args``; returns the value to show."""
    if args.queue:
        wait_in_queue(group)
    if args.steps is not None:
        if args.steps < 1:
            raise UsageError(f"--steps {args.steps} is not allowed: give the number of steps, at least 1")
        expect_steps(group, args.steps)
    options = dict(ranks=ranks, output=args.output, setup=True if args.setup else None,
                   on_failure=args.on_failure, max_failures=args.max_failures)
    if not args.background:
        if args.quiet_after < 0:
            raise UsageError(f"--quiet-after {args.quiet_after:g} is not allowed: give seconds, or 0 to turn it off")
        sink = NotebookSink()
        try:  # a breakpoint() in the cell reads its lines through the kernel's stdin (ask)
            group.run(cell, sink=sink, quiet_after_s=args.quiet_after, prompt=ask, **options)
        except GroupError as exc:
            raise UsageError(str(exc)) from None
        finally:
            sink.close()
        return sink.cell_value()
    route = CellRoute()
    bg_sink = BackgroundSink(route)
    try:
        bg = group.run(cell, sink=bg_sink, background=True, **options)
    except GroupError as exc:
        raise UsageError(str(exc)) from None
    threading.Thread(target=_show_end, args=(bg, route, bg_sink), name="rtnb-background-end", daemon=True).start()
    print("raytrain_nb: running in the background (%dist_wait waits for it, %dist_interrupt stops it)")
    return None


def _show_end(bg: Any, route: CellRoute, sink: NotebookSink) -> None:
    """When the background cell ends with an error, show it in the cell's own output area."""
    route.enter()
    try:
        try:
            bg.wait()  # no deadline: the user's cell runs as long as it runs; its ranks are watched meanwhile
        finally:
            sink.close()
    except WorkerError as exc:
        shell = route.shell
        if shell is not None and hasattr(shell, "showtraceback"):
            shell.showtraceback((type(exc), exc, exc.__traceback__))
        else:
            sys.stderr.write(str(exc) + "\n")
    except RaytrainNbError as exc:
        sys.stderr.write(f"{type(exc).__name__}: {exc}\n")
    except BaseException as exc:  # noqa: BLE001 - shown, and re-raised by %dist_wait
        logger.warning("background cell failed", exc_info=True)
        sys.stderr.write(f"the background cell failed: {type(exc).__name__}: {exc}\n")
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
