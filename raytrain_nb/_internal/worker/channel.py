"""A rank's direct line for cells: the driver on the same machine sends cells over a loopback socket, not Ray.

A Ray actor call costs the caller and the callee about half a millisecond of CPU each (a no-op ``ping`` to 8
actors: 3.4 ms here); the same request over a connected loopback socket costs tens of microseconds. So a driver
on the rank's machine opens this channel (``Worker.open_channel``, a Ray call) and sends its cells over it, its
pulls, and the rollbacks and loads that need no collective; every other call (polls, interrupts, snapshots,
forming) stays a Ray call.

- **Who may send:** the socket listens on 127.0.0.1 only. A connection must first send the token the last
  ``open`` returned (32 hex characters); anything else is closed unanswered. The answer to a good token proves
  the rank knows it too (:func:`proof`, an HMAC of the token) and gives its pid, which the driver checks against
  the rank it meant to reach: no pickle is read from a socket before both ends are known.
- **One driver:** a new authenticated connection (a driver that attached) closes the one before it.
- **Frames:** a 4-byte big-endian length, then a pickle. A request is ``[seq, request]`` with ``request`` as
  ``Worker.run_cell_packed`` takes it; a reply is ``[seq, True, outcome]`` (``CellOutcome.to_wire()``) or
  ``[seq, False, "TypeName: message"]`` when the call itself failed (ours, not the cell's: a cell's error is in
  its outcome). ``[seq, request, method]`` calls one of the few other methods the rank gave (:data:`CELL` is
  the cell's; rollback and load: the ``*_packed`` methods; pull), whose Ray calls cost what a cell's did; its
  failure comes back as the exception itself (``[seq, False, exc]``), as a Ray call would raise it. No other
  method can be reached.
- **A lost line:** the last reply is kept by its connection's token and ``seq`` (:meth:`CellChannel.result`), so a
  driver whose connection broke while the rank lived asks for it through Ray instead. A request is "unknown"
  (it never arrived) only once its connection was read to its end.
"""
from __future__ import annotations

import hashlib
import hmac
import logging
import os
import pickle
import secrets
import socket
import struct
import threading
from typing import Any, Callable, Dict, List, Optional, Tuple

logger = logging.getLogger(__name__)

HEADER = struct.Struct("!I")
TOKEN_BYTES = 32  # hex characters of a token
#: Seconds a new connection has to send its token.
AUTH_S = 5.0
#: Connections whose end is remembered (a driver asks about its own, the newest).
KEPT_CONNECTIONS = 8
#: The answer to a good token: :func:`proof` (64 hex characters), then the pid.
HELLO = struct.Struct("!64sQ")


def proof(token: str) -> bytes:
    """What the rank answers to ``token``: that it knows it, without sending it back."""
    return hmac.new(token.encode(), b"raytrain_nb cell channel", hashlib.sha256).hexdigest().encode()


def frame(payload: Any) -> bytes:
    """``payload`` pickled, behind its length."""
    try:
        data = pickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - a value plain pickle cannot take (a lambda in a report): Ray's pickler can
        from ray import cloudpickle  # ray: inside a worker or driver, where it is loaded already

        data = cloudpickle.dumps(payload, protocol=pickle.HIGHEST_PROTOCOL)
    return HEADER.pack(len(data)) + data


def read_exact(sock: socket.socket, count: int) -> Optional[bytes]:
    """``count`` bytes from ``sock``, or None at its end."""
    chunks, left = [], count
    while left:
        chunk = sock.recv(min(left, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> Optional[Any]:
    """One frame's payload from ``sock``, or None at its end."""
    head = read_exact(sock, HEADER.size)
    if head is None:
        return None
    body = read_exact(sock, HEADER.unpack(head)[0])
    return None if body is None else pickle.loads(body)


#: The method of a two-item request: a cell.
CELL = "cell"


class CellChannel:
    """The listening side of a rank's channel; ``handlers[method](request)`` runs one request (``handlers[CELL]``,
    ``Worker.run_cell_packed``, one cell)."""

    def __init__(self, handlers: Dict[str, Callable[[List[Any]], Any]]) -> None:
        if CELL not in handlers:
            raise ValueError(f"a channel's handlers must include {CELL!r}, got {sorted(handlers)}")
        self._handlers = dict(handlers)
        self._lock = threading.Lock()
        self._listener: Optional[socket.socket] = None
        self._token = ""
        self._conn: Optional[socket.socket] = None
        self._done = threading.Condition(self._lock)
        self._running: Optional[Tuple[str, int]] = None  # (token, seq) of the request being handled
        self._last: Tuple[Optional[Tuple[str, int]], Any] = (None, None)  # (token, seq) and reply of the last one
        self._read_out: Dict[str, bool] = {}  # the newest connections' tokens: read to their end yet

    def open(self) -> Dict[str, Any]:
        """Listen (once) and make a new token; ``{"port", "token", "pid"}`` for the driver to connect with."""
        with self._lock:
            if self._listener is None:
                listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                listener.bind(("127.0.0.1", 0))
                listener.listen(4)
                self._listener = listener
                threading.Thread(target=self._accept, name="rtnb-channel", daemon=True).start()
            self._token = secrets.token_hex(TOKEN_BYTES // 2)
            return {"port": self._listener.getsockname()[1], "token": self._token, "pid": os.getpid()}

    def result(self, token: str, seq: int, wait_s: float) -> Dict[str, Any]:
        """What became of request ``seq`` of the connection that sent ``token``: ``{"state": "done", "reply": ...}``,
        ``"running"`` (running, or its connection not yet read to its end, after ``wait_s``), or ``"unknown"``
        (it never arrived)."""
        key = (token, seq)

        def settled() -> bool:
            return self._last[0] == key or (self._running != key and self._read_out.get(token, True))

        with self._done:
            self._done.wait_for(settled, timeout=wait_s)
            if self._last[0] == key:
                return {"state": "done", "reply": self._last[1]}
            return {"state": "unknown" if settled() else "running"}

    def _reply(self, seq: int, request: Any, method: str) -> List[Any]:
        """``[seq, True, value]`` of ``method`` on ``request``, or ``[seq, False, ...]`` when it raised."""
        handler = self._handlers.get(method)
        if handler is None:
            return [seq, False, f"LookupError: no method {method!r} on this channel (it takes {sorted(self._handlers)})"]
        try:
            return [seq, True, handler(request)]
        except Exception as exc:  # noqa: BLE001 - a cell: our failure, not the cell's; another method: its answer
            if method == CELL:
                logger.exception("the cell that came over the channel failed outside user code")
                return [seq, False, f"{type(exc).__name__}: {exc}"]
            return [seq, False, _sendable(exc)]

    def _accept(self) -> None:
        listener = self._listener
        assert listener is not None
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), name="rtnb-channel-conn", daemon=True).start()

    def _authenticate(self, conn: socket.socket) -> str:
        conn.settimeout(AUTH_S)
        try:
            got = read_exact(conn, TOKEN_BYTES)
        except OSError:
            return ""
        with self._lock:
            token = self._token
        if got is None or not token or not hmac.compare_digest(got, token.encode()):
            return ""
        conn.settimeout(None)
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            old, self._conn = self._conn, conn
            self._read_out[token] = False
            while len(self._read_out) > KEPT_CONNECTIONS:
                del self._read_out[next(iter(self._read_out))]
        if old is not None:  # one driver: the one that attached last
            _close(old)
        conn.sendall(HELLO.pack(proof(token), os.getpid()))
        return token

    def _serve(self, conn: socket.socket) -> None:
        token = ""
        try:
            token = self._authenticate(conn)
            while token:
                message = read_frame(conn)
                if message is None:
                    return
                seq, request, method = (message + [CELL])[:3]
                with self._lock:
                    self._running = (token, seq)
                reply = self._reply(seq, request, method)
                with self._done:
                    self._running, self._last = None, ((token, seq), reply)
                    self._done.notify_all()
                conn.sendall(frame(reply))
        except OSError:  # the driver went away (or attached again): its reply is kept for result()
            return
        finally:
            with self._done:
                if self._conn is conn:
                    self._conn = None
                if token in self._read_out:
                    self._read_out[token] = True  # nothing more can arrive on it
                self._done.notify_all()
            _close(conn)


#: The worker's channel calls, answered while a cell runs (the ``control`` concurrency group).
CONTROL_METHODS = ("open_channel", "channel_result")


class ChannelWorker:
    """The ``Worker``'s half of its channel: the Ray calls that open it and ask after a request."""

    _channel: CellChannel

    def _init_channel(self, handlers: Dict[str, Callable[[List[Any]], Any]]) -> None:
        self._channel = CellChannel(handlers)

    def open_channel(self) -> Dict[str, Any]:
        """Listen for cells on a loopback socket: ``{"port", "token", "pid"}`` to connect with."""
        return self._channel.open()

    def channel_result(self, token: str, seq: int, wait_s: float) -> Dict[str, Any]:
        """What became of request ``seq`` of the connection ``token`` opened (its driver's line broke)."""
        return self._channel.result(token, seq, wait_s)


def _sendable(exc: BaseException) -> BaseException:
    """``exc`` when it pickles (ours do), else a ``RuntimeError`` with its type and message."""
    try:
        pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL)
        return exc
    except Exception:  # noqa: BLE001 - a user's exception that cannot travel: its words do
        return RuntimeError(f"{type(exc).__name__}: {exc}")


def _close(sock: socket.socket) -> None:
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:
        pass
    sock.close()
