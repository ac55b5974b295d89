"""Running one operation under a deadline, and what to do when it hangs: dump every stack.

An operation runs in a daemon thread; the caller waits for it at most its deadline. A hang is an
operation still running at its deadline: the soak then dumps the Python stacks of the driver and
the workers with ``py-spy dump`` (when installed) and fails.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Iterable, List, Optional

#: Library exception classes (raytrain_nb.errors) plus IPython's UsageError, which the magics raise with
#: the library's message: a failure of one of these, with a message, is a *named* failure.
NAMED_KERNEL_ERRORS = frozenset({
    "RaytrainNbError", "GroupError", "TransitionError", "ResourceError", "WorkerDiedError", "InterruptTimeout",
    "WorkerLostError", "WorkerUnresponsiveError",
    "StorageError", "CheckpointError", "RunInUseError", "ConfigError", "SnapshotError", "TrainingFailedError",
    "WorkerGroupError", "ControllerError",
    "WorkerError", "RecoveryError", "UsageError",
})


@dataclasses.dataclass
class Outcome:
    """What one operation came to.

    Attributes:
        ok: it returned without raising.
        value: what it returned.
        error_type: the exception's class name ("" when ok).
        message: the exception's message (first 500 characters).
        named: the failure is a library error with a message (always True when ok).
        hung: it was still running at its deadline.
        elapsed: seconds it took (the deadline when hung).
        later: for a hang, ``later(seconds)`` waits that much longer and returns the final outcome
            (None if it still runs), to tell a slow call from one that never returns.
    """

    ok: bool
    value: Any = None
    error_type: str = ""
    message: str = ""
    named: bool = True
    hung: bool = False
    elapsed: float = 0.0
    later: Optional[Callable[[float], Optional["Outcome"]]] = None

    @property
    def label(self) -> str:
        """``ok``, ``HUNG`` or the error's class name."""
        return "HUNG" if self.hung else ("ok" if self.ok else self.error_type)

    def short(self) -> str:
        first = self.message.strip().splitlines()[0] if self.message.strip() else ""
        return self.label if self.ok or self.hung else f"{self.error_type}: {first[:160]}"


def from_exception(exc: BaseException, elapsed: float = 0.0) -> Outcome:
    """An :class:`Outcome` for a raised exception: named when it is a library error with a message."""
    try:
        from raytrain_nb import RaytrainNbError
        library = isinstance(exc, RaytrainNbError)
    except ImportError:  # the library is broken: nothing it raises is named
        library = False
    message = str(exc)
    return Outcome(ok=False, error_type=type(exc).__name__, message=message[:2000],
                   named=library and bool(message.strip()), elapsed=elapsed)


def call_with_deadline(fn: Callable[[], Any], deadline_s: float, label: str) -> Outcome:
    """Run ``fn()`` in a daemon thread; wait at most ``deadline_s`` seconds.

    Returns:
        Its :class:`Outcome`; ``hung=True`` when it did not return in time (the thread is left running).
    """
    box: dict = {}
    started = time.monotonic()

    def main() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - every failure is classified by the caller
            box["exc"] = exc
        finally:
            box["t"] = time.monotonic() - started

    thread = threading.Thread(target=main, name=f"soak-{label}", daemon=True)
    thread.start()
    thread.join(deadline_s)

    def result() -> Outcome:
        if "exc" in box:
            return from_exception(box["exc"], box["t"])
        return Outcome(ok=True, value=box.get("value"), elapsed=box["t"])

    def later(seconds: float) -> Optional[Outcome]:
        thread.join(seconds)
        return None if thread.is_alive() else result()

    if thread.is_alive():
        return Outcome(ok=False, error_type="Hang", message=f"{label} still running after {deadline_s:g} s",
                       named=False, hung=True, elapsed=deadline_s, later=later)
    return result()


def py_spy() -> Optional[str]:
    """The py-spy executable next to this interpreter, or on PATH."""
    near = os.path.join(os.path.dirname(sys.executable), "py-spy")
    return near if os.path.exists(near) else shutil.which("py-spy")


def dump_stacks(pids: Iterable[int], out_dir: str, tag: str) -> List[str]:
    """``py-spy dump`` of each pid into ``out_dir/<tag>-<pid>.txt``; returns the files written.

    Without py-spy, the driver's own threads are dumped with :func:`sys._current_frames`.
    """
    os.makedirs(out_dir, exist_ok=True)
    files = []
    exe = py_spy()
    for pid in dict.fromkeys(p for p in pids if p):
        path = os.path.join(out_dir, f"{tag}-{pid}.txt")
        if exe:
            try:
                proc = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=60)
                text = proc.stdout + proc.stderr
            except (OSError, subprocess.TimeoutExpired) as exc:
                text = f"py-spy failed: {exc}"
        elif pid == os.getpid():
            import traceback
            text = "\n".join(f"Thread {tid}:\n" + "".join(traceback.format_stack(f))
                             for tid, f in sys._current_frames().items())
        else:
            text = "py-spy is not installed: no stack"
        with open(path, "w") as fh:
            fh.write(text)
        files.append(path)
    return files


#: Frames a thread sits in while it waits for nothing in particular.
_IDLE = ("_FdReader._loop", "Worker.watch", "Queue.get", "HealthMonitor._loop", "PythonGCThread.run",
         "Worker.main_loop", "_monitor_loop", "Timer.run", "select", "epoll")


def excerpt(path: str, lines: int = 40) -> str:
    """The interesting part of a py-spy dump: threads in raytrain_nb or soak code that are not idle waits."""
    with open(path) as fh:
        text = fh.read().splitlines()
    head = [l for l in text[:2] if l.startswith("Process")]
    blocks: list = []
    for line in text:
        if line.startswith("Thread "):
            blocks.append([line])
        elif blocks:
            blocks[-1].append(line)
    keep = []
    for block in blocks:
        frames = [l.strip() for l in block[1:] if l.strip()]
        ours = any("raytrain_nb" in f or "soak/" in f for f in frames)
        idle = bool(frames) and any(frames[min(i, len(frames) - 1)].startswith(_IDLE) for i in (0, 1, 2)) \
            and not any("Dispatch" in f or "_join" in f or "_get" in f for f in frames)
        if ours and not idle:
            keep.extend(block[:16])
    return "\n".join((head + keep)[:lines] if keep else head + ["(every thread waits idle)"])
