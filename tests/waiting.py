"""One way for a test to wait: for a condition, with a deadline, saying what it waited for."""
from __future__ import annotations

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
