"""A cap on how fast worker text goes to a notebook cell.

Jupyter Server drops a kernel's output beyond ``iopub_data_rate_limit`` (1 MB/s by default,
averaged over 3 s) and prints "IOPub data rate exceeded" instead. Several ranks printing every
step can pass that; what the server drops is lost at random. So the notebook sink lets text
through at most ``rate`` characters a second (a token bucket with a burst of ``burst``), holds
back the rest, and says how much was held back: the start of a flood shows, the gap is named,
and output shows again as soon as it slows down.
"""
from __future__ import annotations

import time
from typing import Callable, Optional, Tuple

from .._internal import settings

#: Characters per second let through (below Jupyter Server's default of 1 MB/s, which counts
#: bytes of the JSON messages); ``RAYTRAIN_NB_OUTPUT_RATE`` changes it, 0 turns the cap off.
DEFAULT_RATE = settings.DEFAULT_OUTPUT_RATE
DEFAULT_BURST = 600_000


class RateCap:
    """A token bucket over characters of text.

    Args:
        rate: characters per second let through; 0 lets everything through.
        burst: characters let through at once after a quiet spell.
        clock: seconds, monotonic (a parameter for tests).
    """

    def __init__(self, rate: int | None = None, burst: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.rate = settings.output_rate() if rate is None else rate
        self.burst = max(burst if burst is not None else max(DEFAULT_BURST, 2 * self.rate), 1)
        self.clock = clock
        self._tokens = float(self.burst)
        self._at = clock()
        self.held_back = 0  # characters not shown since the last notice
        self.total_held_back = 0

    def admit(self, text: str) -> Tuple[str, str]:
        """``(shown, notice)``: the part of ``text`` to show, and a line saying what was held back
        (when output resumes after a gap, or when a gap starts); either may be empty."""
        if self.rate <= 0:
            return text, ""
        now = self.clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        notice = ""
        if self.held_back and self._tokens >= min(len(text), self.burst / 4):
            notice = self._resumed()
        if len(text) <= self._tokens:
            self._tokens -= len(text)
            return text, notice
        cut = text.rfind("\n", 0, int(self._tokens)) + 1  # whole lines only
        shown, rest = text[:cut], text[cut:]
        self._tokens -= len(shown)
        first = not self.held_back
        self.held_back += len(rest)
        self.total_held_back += len(rest)
        if first:
            notice += (f"[raytrain_nb: the workers print faster than {self.rate:,} characters/s; output is held "
                       "back until it slows down (RAYTRAIN_NB_OUTPUT_RATE changes the cap)]\n")
        return shown, notice

    def _resumed(self) -> str:
        text = f"[raytrain_nb: {self.held_back:,} characters of output not shown]\n"
        self.held_back = 0
        return text

    def flush(self) -> str:
        """At the end of a cell: the line saying what was held back since the last notice, if anything."""
        return self._resumed() if self.held_back else ""


class MessageBudget:
    """A token bucket over widget messages: at most ``rate`` a second on average, ``burst`` at once.

    A dashboard spends what each update sent (:meth:`spend`, which may overdraw) and waits for :meth:`ready_at`
    before the next one: an update is never cut in half, the one after it waits longer.

    Args:
        rate: messages per second; burst: messages at once after a quiet spell (default: one second's worth).
        clock: seconds, monotonic (a parameter for tests).
    """

    def __init__(self, rate: float, burst: Optional[float] = None, clock: Callable[[], float] = time.monotonic
                 ) -> None:
        if rate <= 0:
            raise ValueError(f"a message budget of {rate!r} a second: give a positive rate")
        self.rate = float(rate)
        self.burst = float(burst if burst is not None else rate)
        self.clock = clock
        self._tokens = self.burst
        self._at = clock()
        self.spent = 0  # messages spent in all

    def _refill(self) -> float:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._at) * self.rate)
        self._at = now
        return now

    def spend(self, messages: int) -> None:
        """Count ``messages`` just sent."""
        self._refill()
        self._tokens -= messages
        self.spent += messages

    def ready_at(self) -> float:
        """When the next update may go (on :attr:`clock`): now, unless the budget is overdrawn."""
        now = self._refill()
        return now if self._tokens >= 0 else now + (-self._tokens) / self.rate
