"""``await dash.fit(tuner)``: a sweep in a thread while the cell awaits it, so that clicks act at once.

A Jupyter kernel handles one request at a time on its main thread: while a plain ``tuner.fit()`` holds
the cell, a click on a Stop button waits in the queue until the sweep has ended. A cell that *awaits*
leaves the kernel's event loop free, and ipykernel (>= 7) hands widget messages to it during the
await. So the sweep runs on its own thread (Tune supports that: it then installs no signal handler)
and the cell awaits it, waking every ``WAKE_S`` so that Ctrl-C lands at once.

Ctrl-C (the kernel's interrupt, which cancels the awaiting cell) does what it does to a plain
``tuner.fit()``: Tune ends every trial, and the results so far are returned.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
from typing import Any, Callable

from ..._internal.train.trainer import install_autoinit
from ..._internal.waits import join_within

logger = logging.getLogger(__name__)

#: The awaiting cell wakes this often (a kernel interrupt is seen only when it wakes).
WAKE_S = 0.2
#: After Ctrl-C, how long the cell waits for Tune to end every trial.
STOP_S = 120.0


async def fit_in_thread(tuner: Any, stop_all: Callable[[], None], enter: Callable[[], None] = lambda: None) -> Any:
    """Run ``tuner.fit()`` on a thread and await it; on Ctrl-C call ``stop_all`` and wait for the sweep to end.

    ``enter`` runs first on that thread (it routes the thread's output to the awaiting cell).

    Returns:
        What ``tuner.fit()`` returned (a ``ResultGrid``), also after Ctrl-C.

    Raises:
        Whatever ``tuner.fit()`` raised; ``KeyboardInterrupt`` when the sweep did not end within
        ``STOP_S`` of Ctrl-C.
    """
    install_autoinit()  # Tune's own ray.init() (when Ray is not running yet) starts the embedded instance
    done: "concurrent.futures.Future[Any]" = concurrent.futures.Future()

    def run() -> None:
        if not done.set_running_or_notify_cancel():
            return
        try:
            enter()
            done.set_result(tuner.fit())
        except BaseException as exc:  # noqa: BLE001 - handed to the awaiting cell
            done.set_exception(exc)

    thread = threading.Thread(target=run, name="rtnb-sweep", daemon=True)
    thread.start()
    waiter = asyncio.wrap_future(done)
    try:
        while not waiter.done():
            # no deadline: the user's own sweep, as long as it runs; Ctrl-C or Stop sweep ends it
            await asyncio.wait({waiter}, timeout=WAKE_S)
    except (asyncio.CancelledError, KeyboardInterrupt):
        logger.warning("Ctrl-C: stopping every trial of the sweep (the results so far are kept)")
        stop_all()
        if not join_within(thread, STOP_S, "the sweep's trials to stop after Ctrl-C", logger):
            raise KeyboardInterrupt(
                f"the sweep did not end within {STOP_S:.0f} s of Ctrl-C: its trials may still run "
                "(ray.shutdown() ends them)") from None
    return done.result(timeout=0)
