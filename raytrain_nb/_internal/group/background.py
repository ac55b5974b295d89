"""A cell running on the workers while the notebook stays free (``%%distributed --background``)."""
from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Optional

from ..errors import InterruptTimeout
from ..waits import wait_until
from .state import SlotState
from .timing import STOP_WAIT_S

logger = logging.getLogger(__name__)


class BackgroundRun:
    """A :meth:`WorkerGroup.run` in a driver thread; :meth:`wait` returns its result or re-raises."""

    def __init__(self, group: Any, target: Callable[[], Any], label: str = "") -> None:
        self.group = group
        self.label = label
        self._result: Any = None
        self._error: Optional[BaseException] = None
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._main, args=(target,), name="rtnb-background", daemon=True)
        self._thread.start()

    def _main(self, target: Callable[[], Any]) -> None:
        try:
            self._result = target()
        except BaseException as exc:  # noqa: BLE001 - re-raised by wait()
            self._error = exc
        finally:
            self._done.set()

    def done(self) -> bool:
        """Whether the cell has ended (successfully or not)."""
        return self._done.is_set()

    @property
    def error(self) -> Optional[BaseException]:
        return self._error if self.done() else None

    def _what(self) -> str:
        return f"the background cell {self.label}".rstrip()

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until the cell ends; return its :class:`CellResult` or raise its error.

        ``timeout=None`` waits as long as the cell runs (its ranks are watched meanwhile: a dead or
        silent rank ends it). A KeyboardInterrupt while waiting does what :meth:`stop` does.

        Raises:
            TimeoutError: ``timeout`` passed first.
            InterruptTimeout: after a KeyboardInterrupt, the cell did not end within ``STOP_WAIT_S``.
        """
        try:
            if not wait_until(self._done.wait, timeout, self._what(), logger):
                raise TimeoutError(f"the background cell is still running after {timeout:g} s")
        except KeyboardInterrupt:
            interrupted = True
        else:
            interrupted = False
        return self.stop() if interrupted else self._outcome()

    def stop(self) -> Any:
        """Interrupt the cell on every rank, then wait up to ``STOP_WAIT_S`` for it to end; return or raise as
        :meth:`wait` does.

        Raises:
            InterruptTimeout: it did not end in time (names the ranks still running it; the cell goes on).
        """
        self.group.interrupt()
        if not wait_until(self._done.wait, STOP_WAIT_S, f"{self._what()} to end after the interrupt", logger):
            running = [str(w.rank) for w in self.group.status(ping=False) if w.state == SlotState.RUNNING]
            where = (f"rank(s) {', '.join(running)} still run it" if running
                     else "its ranks stopped, the group is still settling")
            raise InterruptTimeout(f"the background cell did not end within {STOP_WAIT_S:g} s of the interrupt "
                                   f"({where}): %dist_status shows the ranks; %dist_interrupt again, or %dist_wait "
                                   "to keep waiting")
        return self._outcome()

    def _outcome(self) -> Any:
        if self._error is not None:
            raise self._error
        return self._result

