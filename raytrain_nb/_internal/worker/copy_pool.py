"""CPU buffers that a background snapshot's copies reuse, so a copy costs a memcpy, not fresh pages.

A background (``--async``) snapshot copies the state so training may go on while it is written. A fresh
copy of a large state mostly pays for new memory (the kernel zero-fills every page on first touch: about
5x the copy itself here); copying into the buffers of the previous background snapshot, once that one is
written, costs only the copy. The pool holds at most one state's worth: the buffers of the last written
snapshot, nothing more; a tensor of a shape or dtype it does not hold is copied into new memory.

Example::

    pool = CopyPool()
    copies = [pool.copy(t) for t in tensors]   # reuses buffers of the same shape and dtype
    ...                                        # write the copies
    pool.refill(copies)                        # the next snapshot copies into these
"""
from __future__ import annotations

import collections
import threading
from typing import Any, Deque, Dict, Iterable, Tuple


class CopyPool:
    """Spare CPU tensors by ``(shape, dtype)``; thread-safe (the writer refills, the cell thread takes)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._spare: Dict[Tuple[Any, ...], Deque[Any]] = {}

    def copy(self, tensor: Any) -> Any:
        """A CPU copy of ``tensor``: into a spare buffer of its shape and dtype when there is one."""
        key = (tuple(tensor.shape), tensor.dtype)
        with self._lock:
            spare = self._spare.get(key)
            buf = spare.popleft() if spare else None
        if buf is None:
            return tensor.detach().to("cpu", copy=True)
        return buf.copy_(tensor.detach())

    def refill(self, tensors: Iterable[Any]) -> None:
        """Keep ``tensors`` (copies nothing reads any more) as the spares, in place of any kept before."""
        spare: Dict[Tuple[Any, ...], Deque[Any]] = {}
        for t in tensors:
            if t.device.type == "cpu" and t.is_contiguous() and not t.requires_grad:
                spare.setdefault((tuple(t.shape), t.dtype), collections.deque()).append(t)
        with self._lock:
            self._spare = spare

    def clear(self) -> None:
        """Let the spares go (their memory returns once nothing else holds them)."""
        with self._lock:
            self._spare = {}

    @property
    def nbytes(self) -> int:
        """Bytes held as spares."""
        with self._lock:
            return sum(t.numel() * t.element_size() for q in self._spare.values() for t in q)
