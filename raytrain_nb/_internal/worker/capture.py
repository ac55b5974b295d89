"""Capture a worker's output while a cell runs (worker side).

Python-level ``sys.stdout``/``sys.stderr`` writes and bytes written by C/C++
code on file descriptors 1 and 2 both land in the active cell's
:class:`OutputBuffer`, which the driver drains while the cell runs and once
more when it ends, so output appears live and never leaks into a later cell.
Between cells, output goes where it went before (the worker's log file).
"""
from __future__ import annotations

import array
import codecs
import ctypes
import fcntl
import io
import os
import select
import sys
import termios
import threading
from typing import Any, Dict, List, Optional, Tuple

Item = Tuple[str, Any]  # ("stdout"|"stderr", text) or ("display", (data, metadata))

_MARKER = b"\x00\x01rtnb-sync\x01\x00"
_MAX_BUFFERED_CHARS = 4_000_000


class OutputBuffer:
    """Thread-safe list of output items; consecutive text of one stream is merged."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: List[Item] = []
        self._chars = 0
        self._dropped = 0

    def stream(self, name: str, text: str) -> None:
        if not text:
            return
        with self._lock:
            if self._chars > _MAX_BUFFERED_CHARS:  # nobody drains: keep memory bounded
                self._dropped += len(text)
                return
            self._chars += len(text)
            if self._items and self._items[-1][0] == name:
                self._items[-1] = (name, self._items[-1][1] + text)
            else:
                self._items.append((name, text))

    def display(self, data: Dict[str, Any], metadata: Optional[Dict[str, Any]] = None) -> None:
        with self._lock:
            self._items.append(("display", (data, metadata or {})))

    def drain(self) -> List[Item]:
        with self._lock:
            items, self._items = self._items, []
            self._chars = 0
            if self._dropped:
                items.append(("stderr", f"\n[{self._dropped} characters of output dropped]\n"))
                self._dropped = 0
            return items


class _PythonStream(io.TextIOBase):
    """Replacement for sys.stdout/sys.stderr routing to the active buffer."""

    def __init__(self, name: str, capture: "OutputCapture", original: Any) -> None:
        self._name = name
        self._capture = capture
        self._original = original

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def fileno(self) -> int:
        return 1 if self._name == "stdout" else 2

    def write(self, text: str) -> int:  # type: ignore[override]
        buf = self._capture.buffer
        if buf is not None:
            buf.stream(self._name, text)
        elif self._original is not None:
            self._original.write(text)
        return len(text)

    def flush(self) -> None:
        if self._capture.buffer is None and self._original is not None:
            self._original.flush()


class _FdReader:
    """Reads one redirected file descriptor on a daemon thread."""

    def __init__(self, fd: int, name: str, capture: "OutputCapture") -> None:
        self.fd = fd
        self.name = name
        self._capture = capture
        self.saved = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        self._read_end = read_end
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self.synced = threading.Event()
        self.lock = threading.Lock()  # held by the reading thread from a read until its bytes are routed
        self.held = b""  # a tail that may be the start of a marker, routed with the next read
        self._thread = threading.Thread(target=self._loop, name=f"rtnb-fd{fd}", daemon=True)
        self._thread.start()

    def _emit(self, data: bytes) -> None:
        if not data:
            return
        buf = self._capture.buffer
        if buf is None:
            os.write(self.saved, data)
        else:
            buf.stream(self.name, self._decoder.decode(data))

    def _loop(self) -> None:
        poller = select.poll()
        poller.register(self._read_end, select.POLLIN)
        while True:
            poller.poll()  # wait outside the lock: a sync that finds the pipe empty need not wait for this thread
            with self.lock:  # what is read is routed before the lock is let go (see OutputCapture.sync)
                try:
                    chunk = os.read(self._read_end, 65536)
                except OSError:
                    return
                if not chunk:
                    return
                self._route(chunk)

    def _route(self, chunk: bytes) -> None:
        pending = self.held + chunk
        while True:
            idx = pending.find(_MARKER)
            if idx < 0:
                break
            self._emit(pending[:idx])
            pending = pending[idx + len(_MARKER) :]
            self.synced.set()
        keep = 0  # keep a suffix that may be the start of a marker
        for k in range(min(len(_MARKER) - 1, len(pending)), 0, -1):
            if _MARKER.startswith(pending[-k:]):
                keep = k
                break
        self._emit(pending[: len(pending) - keep])
        self.held = pending[len(pending) - keep :]

    def idle(self) -> bool:
        """Whether every byte written to the descriptor so far has been routed (call with :attr:`lock` held)."""
        if self.held:
            return False
        unread = array.array("i", [0])
        try:
            fcntl.ioctl(self._read_end, termios.FIONREAD, unread, True)
        except OSError:
            return False
        return unread[0] == 0


class OutputCapture:
    """Process-wide capture of stdout/stderr at the Python and file-descriptor level."""

    def __init__(self) -> None:
        self.buffer: Optional[OutputBuffer] = None
        self._readers: List[_FdReader] = []
        self._lock = threading.Lock()
        self._libc: Optional[Any] = None

    def install(self) -> None:
        """Redirect fds 1 and 2 and replace sys.stdout/sys.stderr (once)."""
        if self._readers:
            return
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:
                pass
        self._readers = [_FdReader(1, "stdout", self), _FdReader(2, "stderr", self)]
        sys.stdout = _PythonStream("stdout", self, os.fdopen(os.dup(self._readers[0].saved), "w", buffering=1))
        sys.stderr = _PythonStream("stderr", self, os.fdopen(os.dup(self._readers[1].saved), "w", buffering=1))
        try:
            self._libc = ctypes.CDLL(None)
        except OSError:
            self._libc = None

    def sync(self, timeout: float = 1.0) -> None:
        """Wait until every byte written to fds 1 and 2 so far has been routed.

        A descriptor whose pipe is empty, with nothing read and not yet routed, is done at once (the common case:
        a cell whose C code wrote nothing); otherwise a marker goes through its pipe and its reader says when it
        got there, so what was written before is routed first."""
        if self._libc is not None:
            try:
                self._libc.fflush(None)
            except Exception:
                pass
        behind = []
        for reader in self._readers:
            with reader.lock:
                if reader.idle():
                    continue
                reader.synced.clear()
            os.write(reader.fd, _MARKER)
            behind.append(reader)
        for reader in behind:
            reader.synced.wait(timeout)

    def start(self, buffer: OutputBuffer) -> None:
        """Route output into ``buffer`` from now on."""
        with self._lock:
            self.sync()
            self.buffer = buffer

    def stop(self) -> None:
        """Flush pending output into the current buffer, then route to the log again."""
        with self._lock:
            if self.buffer is None:
                return
            try:
                self.sync()
            finally:
                self.buffer = None
