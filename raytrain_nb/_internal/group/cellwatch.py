"""What the driver watches in a running cell besides its output: resources, debugger prompts, a quiet cell.

The dispatcher (``dispatch.py``) hands each rank's poll here: its resource sample goes to the group's vitals
(observers are told once per poll round that brought a new one), an open debugger session is served
(``debug.py``), and a cell that has shown no output and no report for ``quiet_after_s`` prints once where every
rank is (``whereabouts.py``). A rank paused at a debugger prompt is no quiet cell: the watch starts again.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional

from ..output import OutputSink
from .debug import DebugRelay, Prompt, paused_note
from .whereabouts import where

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)

#: torch's default process-group timeout (``backend.py`` forms groups with it unless told otherwise).
PG_TIMEOUT_S = 1800.0


class QuietWatch:
    """Says once, after ``quiet_after_s`` without output or reports, what ``explain()`` returns (0: never)."""

    def __init__(self, quiet_after_s: float, explain: Callable[[], str], notice: Callable[[str], None],
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.quiet_after_s = quiet_after_s
        self.explain = explain
        self.notice = notice
        self.clock = clock
        self.last = clock()
        self.told = False

    def heard(self) -> None:
        """Output, a report or a prompt came: the quiet time starts again."""
        self.last = self.clock()

    def check(self) -> bool:
        """Print the explanation if the cell has been quiet long enough and it was not said yet."""
        if self.told or self.quiet_after_s <= 0 or self.clock() - self.last < self.quiet_after_s:
            return False
        self.told = True
        try:
            text = self.explain()
        except Exception as exc:  # noqa: BLE001 - a notice, never a failure of the cell
            logger.warning("could not tell where the ranks are: %s", exc)
            return False
        self.notice(f"raytrain_nb: no output for {self.clock() - self.last:.0f} s; {text}")
        return True


class CellWatch:
    """The watches of one running call on the group of ``core``."""

    def __init__(self, core: "GroupCore", sink: OutputSink, prompt: Optional[Prompt] = None,
                 quiet_after_s: float = 0.0) -> None:
        self.core = core
        self.sink = sink
        self.relay = DebugRelay(core, prompt, sink)
        self.quiet = QuietWatch(quiet_after_s, lambda: where(core).line(), sink.notice)

    def heard(self) -> None:
        self.quiet.heard()

    def polled(self, rank: int, answer: Dict[str, Any]) -> None:
        """One rank's poll: its resources, and its debugger session if one is open."""
        self.core.vitals.take(rank, answer.get("resources"))
        state = answer.get("debug")
        if state is not None:
            self.quiet.heard()
            self.relay.serve(rank, state)
            self.quiet.heard()

    def round_done(self) -> None:
        """Every running rank was polled: tell the observers once if a rank's figures changed."""
        if self.core.vitals.changed():
            self.core.notify()

    def check(self) -> None:
        self.quiet.check()

    def finish(self, failed: bool) -> None:
        """The call ended: name ranks paused at a prompt longer than the process group's timeout, if it failed."""
        note = paused_note(self.relay.paused_s, PG_TIMEOUT_S) if failed else ""
        if note:
            self.sink.notice(note)
