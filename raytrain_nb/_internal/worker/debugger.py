"""pdb on a rank's cell thread, its input and output bridged to the driver (``%dist_debug``, ``breakpoint()``).

The prompt runs where the user's code ran (the cell thread), so the rank's namespace, tensors and CUDA state are
the ones the user sees. pdb reads its lines from :class:`Bridge` and writes into it; the driver reads the output
and sends each line through the control channel (``poll`` shows ``debug``; ``debug_input`` answers). A session
opened by ``breakpoint()`` waits ``ACK_S`` for the driver to say a person is at the prompt; without that (a
``--background`` cell, a front end without stdin, a call with no cell to show it in) it is refused in one line
and the code goes on. Only the last failure's traceback is kept (it pins its frames, and what they hold), and it
is dropped when the next cell starts.
"""
from __future__ import annotations

import inspect
import pdb
import queue
import sys
import threading
import time
from types import TracebackType
from typing import Any, Callable, Dict, Optional

#: How long ``breakpoint()`` waits for the driver to take the prompt before it is refused.
ACK_S = 10.0
_END, _ACK = object(), object()


class SessionEnded(BaseException):
    """The driver ended the session (Ctrl-C): the paused code is interrupted (pdb swallows KeyboardInterrupt)."""


class Refused(BaseException):
    """No one is at a prompt for this session (``reason`` says why); the code goes on."""

    def __init__(self, reason: str, said: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.said = said  # the driver said it in the cell already


class Bridge:
    """The one debugger session of this process: pdb's stdout and stdin (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._out: list = []
        self._lines: "queue.Queue[Any]" = queue.Queue()
        self.active = False
        self.acked = False
        self.waiting = False  # pdb waits for a line
        self.started = 0.0
        self.refusal = ""

    # -- pdb's side (the cell thread) --------------------------------------------------------------

    def write(self, text: str) -> int:
        with self._lock:
            self._out.append(text)
        return len(text)

    def flush(self) -> None:
        pass

    def readline(self) -> str:
        """The driver's next line; raises :class:`SessionEnded` or :class:`Refused` when there is none to come."""
        self.waiting = True
        asked = time.monotonic()
        try:
            while True:
                try:
                    item = self._lines.get(timeout=0.1)  # short waits: an interrupt reaches this thread
                except queue.Empty:
                    if self.refusal:
                        raise Refused(self.refusal) from None
                    if not self.acked and time.monotonic() - asked > ACK_S:
                        raise Refused("no cell took the prompt (the driver did not answer)", said=False) from None
                    continue
                if item is _ACK:
                    self.acked = True
                elif item is _END:
                    raise SessionEnded()
                else:
                    return str(item).rstrip("\n") + "\n"
        except KeyboardInterrupt:  # Ctrl-C relayed to the rank: end the session, interrupt the code
            raise SessionEnded() from None
        finally:
            self.waiting = False

    # -- the driver's side (the control thread) ------------------------------------------------------

    def open(self, acked: bool) -> None:
        with self._lock:
            self._out.clear()
        while not self._lines.empty():
            self._lines.get_nowait()
        self.active, self.acked, self.refusal, self.started = True, acked, "", time.monotonic()

    def close(self) -> None:
        self.active = self.waiting = False

    def poll(self) -> Optional[Dict[str, Any]]:
        """``{"output", "waiting", "seconds"}`` while a session is open, else None."""
        if not self.active:
            return None
        with self._lock:
            out, self._out = "".join(self._out), []
        return {"output": out, "waiting": self.waiting and self._lines.empty(),
                "seconds": time.monotonic() - self.started}

    def send(self, line: Optional[str], refuse: str = "") -> bool:
        """A line typed at the prompt (None: only say a person is there); ``refuse``: no one will be."""
        if not self.active:
            return False
        if refuse:
            self.refusal = refuse
        else:
            self._lines.put(_ACK if line is None else line)
        return True

    def end(self) -> bool:
        """End the session (the user pressed Ctrl-C at the prompt)."""
        if self.active:
            self._lines.put(_END)
        return self.active


BRIDGE = Bridge()


class BridgedPdb(pdb.Pdb):
    """pdb reading and writing through :data:`BRIDGE`."""

    def __init__(self) -> None:
        super().__init__(stdin=BRIDGE, stdout=BRIDGE, nosigint=True, readrc=False)  # type: ignore[arg-type]
        self.prompt = "(Pdb) "

    def interaction(self, frame: Any, traceback: Any) -> None:
        try:
            super().interaction(frame, traceback)
        except Refused as exc:
            BRIDGE.close()
            self.set_continue()
            sys.settrace(None)
            if not exc.said:
                sys.stderr.write(f"raytrain_nb: breakpoint() skipped: {exc.reason}\n")
        except SessionEnded:
            BRIDGE.close()
            sys.settrace(None)
            raise KeyboardInterrupt("the debugger session was ended") from None


class Debugger:
    """The rank's debugger: the last failure (for post-mortem) and ``breakpoint()`` on the cell thread."""

    def __init__(self, cell_thread_id: Callable[[], Optional[int]]) -> None:
        self._thread_id = cell_thread_id
        self._failure: Optional[BaseException] = None

    def keep_failure(self, exc: BaseException) -> None:
        self._failure = exc

    def forget_failure(self) -> None:
        """Drop the last failure's frames (a new cell starts: they may pin large tensors)."""
        self._failure = None

    @property
    def failure(self) -> Optional[str]:
        exc = self._failure
        return None if exc is None else f"{type(exc).__name__}: {exc}"

    def post_mortem(self) -> str:
        """pdb on the last failure's traceback, from the first frame of the user's cell; returns when the user
        quits (on the cell thread)."""
        exc = self._failure
        if exc is None or exc.__traceback__ is None:
            raise RuntimeError("no failure to debug on this rank: the last cell did not fail here")
        tb: Optional[TracebackType] = exc.__traceback__
        first = tb
        while tb is not None:
            if tb.tb_frame.f_code.co_filename.startswith("<cell-"):
                first = tb
                break
            tb = tb.tb_next
        BRIDGE.open(acked=True)
        try:
            BRIDGE.write(f"{type(exc).__name__}: {exc}\n")
            debugger = BridgedPdb()
            debugger.reset()
            try:
                debugger.interaction(None, first)
            except KeyboardInterrupt:
                return "ended"
            return "quit"
        finally:
            BRIDGE.close()

    def breakpoint_hook(self, *args: Any, **kwargs: Any) -> None:
        """``sys.breakpointhook``: on the cell thread, a prompt for the driver; elsewhere Python's own."""
        if threading.get_ident() != self._thread_id():  # not user code of a cell: Python's own hook
            sys.__breakpointhook__(*args, **kwargs)
            return
        BRIDGE.open(acked=False)
        debugger = BridgedPdb()
        original_dispatch = debugger.trace_dispatch

        def dispatch(frame: Any, event: str, arg: Any) -> Any:
            result = original_dispatch(frame, event, arg)
            if sys.gettrace() is None or debugger.quitting:
                BRIDGE.close()
            return result

        debugger.trace_dispatch = dispatch  # type: ignore[method-assign]
        here = inspect.currentframe()
        debugger.set_trace(here.f_back if here is not None else None)
