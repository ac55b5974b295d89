"""How a test waits: for a condition, or for a step that must not hang; each with a deadline, saying what."""
from __future__ import annotations

import threading
import time
from typing import Callable, TypeVar

T = TypeVar("T")


def wait_for(condition: Callable[[], T], timeout: float, what: str, interval: float = 0.05) -> T:
    """Call ``condition`` until it returns something truthy, and return that.

    Raises:
        AssertionError: ``timeout`` seconds passed first; the message names ``what`` was awaited.
    """
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"waited {timeout:g} s for {what}; it did not happen")
        time.sleep(interval)


def bounded(timeout: float, what: str, fn: Callable[[], T]) -> T:
    """``fn()``, which must return (or raise) within ``timeout`` seconds: a hang fails the test, naming ``what``.

    ``fn`` runs in a daemon thread; its exception is raised here.
    """
    box: dict = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - raised in the test's thread
            box["error"] = exc

    thread = threading.Thread(target=run, name=f"bounded: {what}", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise AssertionError(f"{what} did not return within {timeout:g} s (a hang)")
    if "error" in box:
        raise box["error"]
    return box["value"]
