"""A real Jupyter kernel driven through jupyter_client (helpers for tests/notebook).

:class:`Kernel` runs cells and keeps every iopub message of a cell with the
kernel-side time it was sent (``header.date``), so tests can assert on what a
user sees (streams, results, displays, errors) and on when it arrived.
"""
from __future__ import annotations

import dataclasses
import os
import queue
import re
import time
from typing import Any, Callable, Dict, List, Optional

from ..waiting import wait_for

#: The kernel's environment: its embedded Ray gets 8 logical CPUs on this 2-core machine.
KERNEL_ENV = {"RAYTRAIN_NB_NUM_CPUS": "8", "OMP_NUM_THREADS": "1"}
#: Generous: other Ray test suites may load the machine.
START_TIMEOUT_S = 240.0
CELL_TIMEOUT_S = 120.0

#: A kernel cell: whether every CPU of the kernel's Ray instance is free (or Ray is not started).
FREED_CHECK = """import ray as _ray
not _ray.is_initialized() or _ray.available_resources().get("CPU", 0) >= _ray.cluster_resources()["CPU"]"""

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


@dataclasses.dataclass
class Msg:
    """One iopub message of a cell; ``t`` is when the kernel sent it (epoch seconds)."""

    type: str
    content: Dict[str, Any]
    t: float


@dataclasses.dataclass
class Cell:
    """Everything a cell produced."""

    code: str
    msg_id: str
    submitted: float
    msgs: List[Msg] = dataclasses.field(default_factory=list)
    reply: Optional[Dict[str, Any]] = None
    reply_t: float = 0.0
    received_t: float = 0.0  # when this process got the reply

    @property
    def status(self) -> str:
        return self.reply["status"] if self.reply else "pending"

    def of(self, kind: str) -> List[Msg]:
        return [m for m in self.msgs if m.type == kind]

    def streams(self, name: Optional[str] = None) -> List[Msg]:
        return [m for m in self.of("stream") if name is None or m.content["name"] == name]

    @property
    def stdout(self) -> str:
        return "".join(m.content["text"] for m in self.streams("stdout"))

    @property
    def stderr(self) -> str:
        return "".join(m.content["text"] for m in self.streams("stderr"))

    @property
    def result(self) -> Optional[Dict[str, Any]]:
        """The execute_result's data (``{"text/plain": ...}``), or None."""
        results = self.of("execute_result")
        assert len(results) <= 1, f"{len(results)} execute_results: {results}"
        return results[0].content["data"] if results else None

    @property
    def value(self) -> Optional[str]:
        data = self.result
        return data.get("text/plain") if data else None

    @property
    def displays(self) -> List[Dict[str, Any]]:
        return [m.content["data"] for m in self.of("display_data")]

    @property
    def error(self) -> Optional[Dict[str, Any]]:
        errors = self.of("error")
        assert len(errors) <= 1, f"{len(errors)} error messages: {errors}"
        return errors[0].content if errors else None

    @property
    def error_text(self) -> str:
        err = self.error
        return strip_ansi("\n".join(err["traceback"])) if err else ""

    def check(self) -> "Cell":
        """Assert the cell succeeded; show its error otherwise."""
        assert self.status == "ok", f"cell failed:\n{self.code}\n---\n{self.error_text}\n{self.stderr}"
        return self

    def describe(self) -> str:
        return "\n".join(f"{m.t - self.submitted:7.3f} {m.type}: {m.content}" for m in self.msgs)


class Kernel:
    """One ipykernel process (the venv's interpreter) with a blocking client."""

    def __init__(self, cwd: str, env: Optional[Dict[str, str]] = None) -> None:
        from jupyter_client.manager import start_new_kernel

        self.cwd = cwd
        full_env = {**os.environ, **KERNEL_ENV, **(env or {})}
        full_env.pop("RAY_ADDRESS", None)  # its own embedded Ray instance, never a shared cluster
        self.km, self.kc = start_new_kernel(kernel_name="python3", startup_timeout=60, env=full_env, cwd=cwd)
        self.pid: int = self.km.provisioner.process.pid
        self._cells: Dict[str, Cell] = {}

    # -- running cells --------------------------------------------------------------------

    def submit(self, code: str, allow_stdin: bool = False) -> Cell:
        submitted = time.time()
        msg_id = self.kc.execute(code, stop_on_error=False, allow_stdin=allow_stdin)
        cell = Cell(code=code, msg_id=msg_id, submitted=submitted)
        self._cells[msg_id] = cell
        return cell

    def _next(self, deadline: float, what: str, cell: Cell) -> Optional[Msg]:
        """Read one iopub message; file it under its cell. Returns it if it is ``cell``'s."""
        left = deadline - time.time()
        if left <= 0:
            raise TimeoutError(f"{what}: timed out; so far:\n{cell.describe()}")
        try:
            raw = self.kc.get_iopub_msg(timeout=min(left, 1.0))
        except queue.Empty:
            return None
        owner = self._cells.get(raw["parent_header"].get("msg_id"))
        if owner is None:
            return None
        msg = Msg(raw["msg_type"], raw["content"], raw["header"]["date"].timestamp())
        owner.msgs.append(msg)
        return msg if owner is cell else None

    def wait_for(self, cell: Cell, predicate: Callable[[Msg], bool], timeout: float = CELL_TIMEOUT_S) -> Msg:
        """Read ``cell``'s messages until one satisfies ``predicate`` (e.g. a given print arrived)."""
        deadline = time.time() + timeout
        for msg in list(cell.msgs):
            if predicate(msg):
                return msg
        while True:
            msg = self._next(deadline, "waiting for a message", cell)
            if msg is not None and predicate(msg):
                return msg
            if msg is not None and msg.type == "status" and msg.content["execution_state"] == "idle":
                raise AssertionError(f"the cell ended before the awaited message came:\n{cell.describe()}")

    def finish(self, cell: Cell, timeout: float = CELL_TIMEOUT_S) -> Cell:
        """Collect the execute reply and every iopub message of ``cell`` up to its idle status."""
        deadline = time.time() + timeout
        while cell.reply is None:
            raw = _receive(self.kc.get_shell_msg, deadline,
                           lambda: f"no execute_reply within {timeout:g} s; so far:\n{cell.describe()}")
            if raw["parent_header"].get("msg_id") == cell.msg_id:
                cell.received_t = time.time()
                cell.reply = raw["content"]
                cell.reply_t = raw["header"]["date"].timestamp()
        if not any(m.type == "status" and m.content["execution_state"] == "idle" for m in cell.msgs):
            self.wait_for(cell, lambda m: m.type == "status" and m.content["execution_state"] == "idle",
                          timeout=max(deadline - time.time(), 10.0))
        return cell

    def await_prompt(self, timeout: float = CELL_TIMEOUT_S) -> str:
        """Wait for the kernel's next ``input_request`` on the stdin channel and leave it unanswered (to interrupt
        the kernel at the prompt, as Ctrl-C or the stop button does); returns its prompt."""
        deadline = time.time() + timeout
        while True:
            msg = _receive(self.kc.get_stdin_msg, deadline, lambda: f"no input request within {timeout:g} s")
            if msg["msg_type"] == "input_request":
                return msg["content"]["prompt"]

    def answer(self, answers: List[str], timeout: float = CELL_TIMEOUT_S) -> List[str]:
        """Answer the kernel's next ``input_request``s on the stdin channel with ``answers``, in order (a cell
        submitted with ``allow_stdin=True``); returns the prompts the kernel showed."""
        prompts: List[str] = []
        deadline = time.time() + timeout
        for line in answers:
            while True:
                msg = _receive(self.kc.get_stdin_msg, deadline,
                               lambda: f"no input request for {line!r} within {timeout:g} s (prompts: {prompts})")
                if msg["msg_type"] == "input_request":
                    prompts.append(msg["content"]["prompt"])
                    self.kc.input(line)
                    break
        return prompts

    def run(self, code: str, timeout: float = CELL_TIMEOUT_S) -> Cell:
        """Run a cell to its end (it may fail: see :meth:`Cell.check`)."""
        return self.finish(self.submit(code), timeout)

    def ok(self, code: str, timeout: float = CELL_TIMEOUT_S) -> Cell:
        """Run a cell that must succeed."""
        return self.run(code, timeout).check()

    def interrupt(self) -> float:
        """Send the same interrupt as Jupyter's stop button; return when it was sent."""
        sent = time.time()
        self.km.interrupt_kernel()
        return sent

    # -- lifecycle --------------------------------------------------------------------------

    def ensure_group(self, setup: str = "", timeout: float = START_TIMEOUT_S) -> Cell:
        """Start the 2-worker group if this kernel has none, running ``setup`` on it."""
        live = self.ok("import raytrain_nb as _rt\n_rt.active_group() is not None").value
        if live == "True":
            return self.ok(f"%%distributed\n{setup or 'pass'}")
        return self.ok(f"%%distributed --workers 2\n{setup or 'pass'}", timeout)

    def hand_on(self, cwd: str, timeout: float = 60.0) -> bool:
        """Make this kernel as a new one looks to a test module: no group, every CPU of its Ray instance free,
        an empty namespace, ``cwd`` its folder (``%load_ext`` stays done, the Ray instance up). False where it
        does not answer or something stays reserved: the caller starts a new kernel then."""
        if not self.km.is_alive():
            return False
        try:
            self.ok("import raytrain_nb as _rt\n_g = _rt.active_group()\nif _g is not None:\n    _g.shutdown()",
                    timeout)
            wait_for(lambda: self.ok(FREED_CHECK, timeout).value == "True", timeout / 2,
                     "every CPU of the kernel's Ray instance to be free", interval=0.2)
            self.ok(f"%reset -f\n%cd -q {cwd}", timeout)
        except (AssertionError, TimeoutError):
            return False
        self.cwd = cwd
        return True

    def close(self) -> None:
        """Stop the kernel, its Ray instance first.

        Without that, ipykernel's shutdown waits on Ray's child processes and
        jupyter_client signals the kernel after 5 s (test_nb_shutdown covers that path).
        """
        if self.km.is_alive():
            try:
                self.run("import ray\nray.shutdown()", timeout=60)
            except Exception:  # the kernel may be busy or dying: shut it down anyway
                pass
            self.km.shutdown_kernel(now=False)
        self.kc.stop_channels()


def usage_error(cell: Cell) -> str:
    """Assert ``cell`` failed with a one-line UsageError (no traceback); return its message.

    IPython shows a UsageError as one line on stderr, ``UsageError: <message>``,
    and replies with ``ename="UsageError"``.
    """
    assert cell.status == "error", f"the cell did not fail:\n{cell.describe()}"
    assert cell.reply["ename"] == "UsageError", f"not a UsageError: {cell.reply['ename']}\n{cell.error_text}"
    assert cell.error is None, f"a UsageError shows no traceback, got:\n{cell.error_text}"
    lines = [line for line in strip_ansi(cell.stderr).splitlines() if line.strip()]
    assert lines == [f"UsageError: {cell.reply['evalue']}"], f"a UsageError is one line, got:\n{cell.stderr}"
    assert "\n" not in cell.reply["evalue"]
    return cell.reply["evalue"]


def _receive(get: Callable[..., Dict[str, Any]], deadline: float, what: Callable[[], str]) -> Dict[str, Any]:
    """The next message from a channel's ``get`` (``get_shell_msg``, ``get_stdin_msg``) before ``deadline``, or a
    TimeoutError saying ``what()`` was waited for."""
    while True:
        left = deadline - time.time()
        if left <= 0:
            raise TimeoutError(what())
        try:
            return get(timeout=min(left, 1.0))
        except queue.Empty:
            continue
