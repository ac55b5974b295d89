"""A cell running on the workers while the notebook stays free (``%%distributed --background``)."""
from __future__ import annotations

import threading
from typing import Any, Callable, Optional


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

    def wait(self, timeout: Optional[float] = None) -> Any:
        """Block until the cell ends; return its :class:`CellResult` or raise its error.

        A KeyboardInterrupt while waiting interrupts the cell on every rank, then waits for it.

        Raises:
            TimeoutError: ``timeout`` passed first.
        """
        try:
            if not self._done.wait(timeout):
                raise TimeoutError(f"the background cell is still running after {timeout:g} s")
        except KeyboardInterrupt:
            self.group.interrupt()
            self._done.wait()
        if self._error is not None:
            raise self._error
        return self._result
