"""When the dashboard's widgets catch up with the group: changes recorded, flushed at most every 100 ms, off the cell.

The group's observers run on the cell's path (inside ``group.run``), so they only record what changed
(:meth:`Pending.mark`); a timer thread brings the widgets in line (the dashboard's ``flush``) when
:meth:`Pending.due` says so. Three rules decide when:

* at most one flush per ``interval_s`` (100 ms): a burst of reports is one update;
* a cell shows as running only once it has run for ``interval_s``: a cell that ends sooner (a no-op
  ``%%distributed`` cell takes ~20 ms) flips the group RUNNING -> IDLE before any flush sees it, so it
  sends no widget message at all, while a longer one greys the buttons within ~100 ms;
* reports or new checkpoints never wait more than ``latest_s``, even while short cells keep starting.

Every widget message costs the kernel (and the browser) time: :func:`assign` sets only the traits
whose value differs, and several at once as one message, and counts it (:func:`sent`): a dashboard spends
what each flush sent from a budget of messages a second, so a group of any size sends at most that many.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from typing import Any, Callable, FrozenSet, Iterable, Optional, Set, Tuple

#: At most one widget update per this many seconds; also how long a cell runs before it shows as running.
FLUSH_INTERVAL_S = 0.1
#: Reports and checkpoints are shown within this many seconds, whatever cells do meanwhile.
LATEST_S = 1.0


def assign(widget: Any, **traits: Any) -> int:
    """Set the ``traits`` of ``widget`` whose value differs (in the order given), as one message.

    Returns:
        How many traits changed (0: nothing was sent).
    """
    changed = [(name, value) for name, value in traits.items() if getattr(widget, name) != value]
    if changed:
        count(1)
    if len(changed) == 1:
        setattr(widget, *changed[0])
    elif changed:
        with widget.hold_sync():
            for name, value in changed:
                setattr(widget, name, value)
    return len(changed)


_SENT = threading.local()


def count(messages: int) -> None:
    """Count ``messages`` sent to the front end on this thread (:func:`assign` counts its own)."""
    _SENT.n = getattr(_SENT, "n", 0) + messages


def sent() -> int:
    """Widget messages counted on this thread so far: a dashboard's flush spends the difference from its
    message budget (:class:`~raytrain_nb.notebook.ratecap.MessageBudget`)."""
    return getattr(_SENT, "n", 0)


@dataclasses.dataclass(frozen=True)
class Changes:
    """What changed since the last flush."""

    workers: bool = False  # the group's or a worker's state: re-read the workers, the title, the buttons
    ranks: FrozenSet[int] = frozenset()  # ranks with new reports
    checkpoints: bool = False  # the checkpoint list may have changed

    def __bool__(self) -> bool:
        return self.workers or bool(self.ranks) or self.checkpoints


class Pending:
    """The changes the observers recorded and not yet flushed, and when the next flush is due (thread-safe).

    Args:
        interval_s: the least time between two flushes, and how long a cell runs before it shows.
        latest_s: reports and checkpoints wait at most this long.
        clock: seconds, monotonic (tests pass their own).
    """

    def __init__(self, interval_s: float = FLUSH_INTERVAL_S, latest_s: float = LATEST_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s = interval_s
        self.latest_s = latest_s
        self.clock = clock
        self.wake = threading.Event()  # set on every mark: the timer thread re-reads due()
        self._lock = threading.Lock()
        self._seq = 0
        self._workers = False
        self._ranks: Set[int] = set()
        self._checkpoints = False
        self._first: Optional[float] = None  # when the oldest change not flushed came
        self._last_flush = float("-inf")
        self._cell_since: Optional[float] = None  # a cell started then and has not ended

    def mark(self, *, workers: bool = False, ranks: Iterable[int] = (), checkpoints: bool = False,
             cell: Optional[bool] = None) -> None:
        """Record a change; ``cell=True``: a cell (or a recovery) started, ``False``: it ended."""
        now = self.clock()
        with self._lock:
            self._seq += 1
            self._workers |= workers
            self._ranks.update(ranks)
            self._checkpoints |= checkpoints
            if self._first is None:
                self._first = now
            if cell is True and self._cell_since is None:
                self._cell_since = now
            elif cell is False:
                self._cell_since = None
        self.wake.set()

    def due(self) -> Optional[float]:
        """When the next flush may happen (on :attr:`clock`), or None: nothing to flush."""
        with self._lock:
            if not (self._workers or self._ranks or self._checkpoints):
                return None
            at = self._last_flush + self.interval_s
            if self._cell_since is not None:  # a cell that ends within interval_s is never shown running
                at = max(at, self._cell_since + self.interval_s)
                if self._ranks or self._checkpoints:
                    at = min(at, self._first + self.latest_s)
            return at

    def peek(self) -> Tuple[int, Changes]:
        """The changes so far and their sequence number (for :meth:`clear`)."""
        with self._lock:
            return self._seq, Changes(self._workers, frozenset(self._ranks), self._checkpoints)

    def clear(self, seq: int) -> bool:
        """A flush was shown: the changes up to ``seq`` are cleared, unless more came since :meth:`peek`
        (then False, and they stay for the next flush; the time of this one counts either way)."""
        now = self.clock()
        with self._lock:
            self._last_flush = now
            if seq != self._seq:
                return False
            self._workers, self._checkpoints, self._first = False, False, None
            self._ranks.clear()
            return True

    def holding(self) -> bool:
        """Whether a cell started less than ``interval_s`` ago and runs on (it is not to be shown yet)."""
        with self._lock:
            return self._cell_since is not None and self.clock() < self._cell_since + self.interval_s
