"""The worker's cell thread, and values made fit to travel to the driver."""
from __future__ import annotations

import collections
import concurrent.futures
import copy
import sys
import threading
from typing import Any, Callable, Deque, Optional, Tuple


class _Done:
    """One call's end, as :meth:`CellThread.call` waits for it: a lock the cell thread lets go."""

    __slots__ = ("lock", "value", "error")

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.lock.acquire()
        self.value: Any = None
        self.error: Optional[BaseException] = None


class CellThread:
    """A single long-lived thread that runs submitted callables in order.

    Calls are handed over with bare locks, not a ``queue.Queue`` and a ``Future`` (whose conditions cost several
    more wake-ups and GIL hand-offs): a no-op call takes about a third of the time after the thread slept.
    """

    def __init__(self) -> None:
        self._jobs: Deque[Tuple[Callable[..., Any], Tuple[Any, ...], Any]] = collections.deque()
        self._wake = threading.Lock()  # held while there is nothing new to do; let go by a submitter
        self._wake.acquire()
        #: The name of the call running now (``_join``, ``_run_cell``...), None when idle.
        self.current: Optional[str] = None
        #: Calls started so far (a look that may skip work when only one cell ran since compares it).
        self.calls = 0
        self._thread = threading.Thread(target=self._loop, name="rtnb-cell", daemon=True)
        self._thread.start()

    @property
    def ident(self) -> Optional[int]:
        return self._thread.ident

    def _loop(self) -> None:
        while True:
            self._wake.acquire()
            while self._jobs:
                fn, args, end = self._jobs.popleft()
                if isinstance(end, _Done):
                    self._run(fn, args, end)
                elif end.set_running_or_notify_cancel():
                    done = _Done()
                    self._run(fn, args, done)
                    if done.error is not None:
                        end.set_exception(done.error)
                    else:
                        end.set_result(done.value)

    def _run(self, fn: Callable[..., Any], args: Tuple[Any, ...], done: _Done) -> None:
        self.calls += 1
        self.current = getattr(fn, "__name__", "call")
        try:
            done.value = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            done.error = exc
        finally:
            self.current = None
            done.lock.release()

    def _put(self, fn: Callable[..., Any], args: Tuple[Any, ...], end: Any) -> None:
        self._jobs.append((fn, args, end))
        try:
            self._wake.release()
        except RuntimeError:  # already let go (the thread has yet to look): it finds this call too
            pass

    def submit(self, fn: Callable[..., Any], *args: Any) -> "concurrent.futures.Future[Any]":
        fut: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        self._put(fn, args, fut)
        return fut

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        done = _Done()
        self._put(fn, args, done)
        done.lock.acquire()
        if done.error is not None:
            raise done.error
        return done.value


def to_cpu(value: Any) -> Any:
    """A value fit to travel to a driver without GPUs: unwrapped DDP, tensors on CPU."""
    torch = sys.modules.get("torch")
    if torch is None:
        return value
    if isinstance(value, torch.nn.parallel.DistributedDataParallel):
        value = value.module
    if isinstance(value, torch.nn.Module):
        if any(p.device.type != "cpu" for p in list(value.parameters()) + list(value.buffers())):
            value = copy.deepcopy(value).to("cpu")
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().cpu() if value.device.type != "cpu" else value
    if isinstance(value, dict):
        return {k: to_cpu(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(to_cpu(v) for v in value)
    return value
