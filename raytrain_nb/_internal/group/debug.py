"""The driver's half of a debugger on a rank: pdb's output into the cell, each prompt answered by the user.

A rank's pdb runs on its cell thread (``worker/debugger.py``); the driver sees it in the rank's poll
(``debug``: its output, and whether it waits for a line), shows the output through the cell's sink, asks the
user with ``prompt`` (in a kernel, ``input()``: Jupyter's stdin channel) and sends the line back. Without a
``prompt`` (a ``--background`` cell) or a front end without stdin, a ``breakpoint()`` is refused in one line.
Ctrl-C at the prompt ends the session: the paused code is interrupted, as Ctrl-C interrupts a cell.
"""
from __future__ import annotations

import builtins
import logging
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Set

from ..errors import GroupError, first_line
from ..output import OutputSink
from . import timing
from .fanout import FANOUT, ReplyKind, collect
from .state import SlotState

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)

Prompt = Callable[[str], str]
NO_PROMPT = "a --background cell (or a call without prompt=) has no cell to show the prompt in"
NO_STDIN = "this front end does not take input (no stdin channel)"


class DebugRelay:
    """Serves the debugger prompts of ranks in one running call (a cell, or a post-mortem)."""

    def __init__(self, core: "GroupCore", prompt: Optional[Prompt], sink: OutputSink) -> None:
        self.core = core
        self.prompt = prompt
        self.sink = sink
        self.acked: Set[int] = set()
        self.paused_s: Dict[int, float] = {}  # the longest pause at a prompt of each rank

    def _send(self, rank: int, call: Callable[[Any], Any], what: str) -> Any:
        replies = FANOUT.ask([self.core.slots[rank]], call, timing.CONTROL_CALL_S, what, ranks=[rank])
        return replies[0].value if replies[0].kind is ReplyKind.OK else None

    def _refuse(self, rank: int, why: str) -> None:
        self._send(rank, lambda s: s.actor.debug_input.remote(None, why), "the refusal of a prompt")
        self.sink.notice(f"raytrain_nb: breakpoint() on rank {rank} skipped: {why}")

    def serve(self, rank: int, state: Dict[str, Any]) -> None:
        """Show what pdb wrote on ``rank``; when it waits for a line, ask the user and send it."""
        self.paused_s[rank] = max(self.paused_s.get(rank, 0.0), float(state.get("seconds", 0.0)))
        output = state.get("output") or ""
        waiting = bool(state.get("waiting"))
        if waiting and output.endswith("(Pdb) "):
            output = output[: -len("(Pdb) ")]
        if self.prompt is None:
            if waiting:
                self._refuse(rank, NO_PROMPT)
            return
        if output:
            self.sink.stream(rank, "stdout", output, False)
        if not waiting:
            return
        if rank not in self.acked:  # a person is at the prompt: the rank waits for them without a deadline
            self.acked.add(rank)
            self._send(rank, lambda s: s.actor.debug_input.remote(None), "the rank to take the prompt")
        try:
            line = self.prompt(f"[rank {rank}] (Pdb) ")
        except KeyboardInterrupt:
            self._send(rank, lambda s: s.actor.debug_end.remote(), "the debugger session to end")
            raise
        except (NotImplementedError, EOFError) as exc:  # IPython's StdinNotImplementedError is one
            logger.debug("no stdin for the debugger: %s", exc)
            self._refuse(rank, NO_STDIN)
            return
        self._send(rank, lambda s: s.actor.debug_input.remote(line), "the rank to take the line")


def ask_user(text: str) -> str:
    """``input(text)`` as the process has it now (a kernel replaces it while a cell runs: Jupyter's stdin)."""
    return builtins.input(text)


def post_mortem(core: "GroupCore", rank: Optional[int], prompt: Optional[Prompt], sink: OutputSink) -> str:
    """pdb on ``rank``'s last failure (see ``WorkerGroup.debug``); returns ``quit`` or ``ended`` (Ctrl-C)."""
    core.check_not_running()
    if rank is None:
        rank = next((i for i, s in enumerate(core.slots) if s.state == SlotState.FAILED), 0)
    prompt = prompt or ask_user
    if not 0 <= rank < core.num_workers:
        raise GroupError(f"rank {rank} does not exist: the group has ranks 0..{core.num_workers - 1}")
    slot = core.slots[rank]
    if slot.gone:
        raise GroupError(f"rank {rank} is {slot.state.value}: its frames went with its process")
    replies = FANOUT.ask([slot], lambda s: s.actor.last_failure.remote(), timing.CONTROL_CALL_S,
                         f"rank {rank} to say what it last failed with", ranks=[rank])
    failure = replies.check()[0]
    if failure is None:
        raise GroupError(f"rank {rank} has no failure to debug: its last cell did not fail there (frames are kept "
                         "from the last failed cell until the next cell starts); --rank R picks another rank")
    ref = slot.actor.post_mortem.remote()
    relay = DebugRelay(core, prompt, sink)
    seen, started = False, time.monotonic()
    interrupted = False
    while True:
        polled = FANOUT.ask([slot], lambda s: s.actor.poll.remote(), timing.CONTROL_CALL_S,
                            f"rank {rank}'s debugger", ranks=[rank])
        state = polled.check()[0].get("debug")
        if state is not None:
            seen = True
            try:
                relay.serve(rank, state)
            except KeyboardInterrupt:
                interrupted = True
        elif seen or time.monotonic() - started > timing.CONTROL_CALL_S:
            break
        time.sleep(timing.POLL_INTERVAL_S)
    outcome = collect([ref], timing.CONTROL_CALL_S, f"rank {rank}'s debugger session to end", [slot])[0]
    return "ended" if interrupted else str(outcome)


def paused_note(paused_s: Dict[int, float], pg_timeout_s: Optional[float]) -> str:
    """A line naming the ranks paused at a prompt longer than the process group's timeout (their peers' collective
    timed out while they were paused), or empty."""
    if not pg_timeout_s:
        return ""
    long = sorted(r for r, s in paused_s.items() if s > pg_timeout_s)
    if not long:
        return ""
    return (f"rank(s) {', '.join(map(str, long))} paused at the debugger for longer than the process group's timeout "
            f"({pg_timeout_s:g} s): their peers' collectives timed out meanwhile")

