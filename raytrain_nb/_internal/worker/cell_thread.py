"""The worker's cell thread, and values made fit to travel to the driver."""
from __future__ import annotations

import concurrent.futures
import copy
import queue
import sys
import threading
from typing import Any, Callable, Optional


class CellThread:
    """A single long-lived thread that runs submitted callables in order."""

    def __init__(self) -> None:
        self._queue: "queue.Queue[Any]" = queue.Queue()
        #: The name of the call running now (``_join``, ``_run_cell``...), None when idle.
        self.current: Optional[str] = None
        self._thread = threading.Thread(target=self._loop, name="rtnb-cell", daemon=True)
        self._thread.start()

    @property
    def ident(self) -> Optional[int]:
        return self._thread.ident

    def _loop(self) -> None:
        while True:
            fn, args, fut = self._queue.get()
            if fut.set_running_or_notify_cancel():
                self.current = getattr(fn, "__name__", "call")
                try:
                    fut.set_result(fn(*args))
                except BaseException as exc:  # noqa: BLE001 - handed to the caller
                    fut.set_exception(exc)
                finally:
                    self.current = None

    def submit(self, fn: Callable[..., Any], *args: Any) -> "concurrent.futures.Future[Any]":
        fut: "concurrent.futures.Future[Any]" = concurrent.futures.Future()
        self._queue.put((fn, args, fut))
        return fut

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        return self.submit(fn, *args).result()


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
