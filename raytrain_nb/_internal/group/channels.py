"""The driver's side of the ranks' cell channels (``worker/channel.py``): cells to ranks on this machine go over
a loopback socket each, not as Ray calls.

:func:`channels_for` opens what is missing (one ``Worker.open_channel`` Ray call for the ranks that have none,
then a connection each, checked by the rank's pid) and returns every target's :class:`Channel`, or None when any
target cannot have one: it runs on another machine (only loopback is used, so nothing listens on a network),
``RAYTRAIN_NB_CELL_CHANNEL=0``, or opening failed (that rank then stays on Ray calls until it is replaced).
A cell then goes to all its ranks one way: every channel, or every Ray call.

:meth:`Channel.send` returns a :class:`ChannelCall`, which ``dispatch.py`` holds where it would hold a Ray ref;
:func:`wait_calls` waits for replies on all of them at once (``selectors``), under a deadline.
"""
from __future__ import annotations

import contextlib
import logging
import pickle
import selectors
import socket
import threading
import time
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, Optional, Sequence

from .. import settings
from ..worker.channel import HEADER, HELLO, TOKEN_BYTES, frame, proof, read_exact
from . import timing
from .fanout import FANOUT
from .slots import Slot

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)

#: Seconds to connect to a rank's channel and hear its pid back.
CONNECT_S = 2.0
#: ``Slot.channel`` of a rank that cannot have one (another machine, or opening failed).
UNAVAILABLE = False


class Channel:
    """A connection to one rank's channel."""

    def __init__(self, sock: socket.socket, pid: int, token: str) -> None:
        self.sock = sock
        self.pid = pid
        self.token = token  # what the rank knows this connection by (Worker.channel_result)
        self.seq = 0
        self.broken = False
        # bytes read and not yet a whole reply (a reply to a call given up on is read, then dropped); grown in
        # place, so a large reply (a pulled model) costs one copy of each chunk, not one of all before it
        self.buf = bytearray()
        self.lock = threading.Lock()  # held by whoever has calls in flight on it (claimed)

    def send(self, request: List[Any], method: Optional[str] = None) -> "ChannelCall":
        """Send one cell's request (``Worker.run_cell_packed``'s), or ``method``'s (one of the few others the rank's
        channel takes: ``worker/channel.py``); a send that fails gives a call already lost."""
        self.seq += 1
        call = ChannelCall(self, self.seq)
        try:
            self.sock.sendall(frame([self.seq, request] if method is None else [self.seq, request, method]))
        except OSError:
            call.lost = True
            self.broken = True
        return call

    def close(self) -> None:
        self.broken = True
        try:
            self.sock.close()
        except OSError:
            pass


class ChannelCall:
    """One cell sent over a channel: its reply, read as it arrives (``reply`` is ``[seq, ok, value]``), or ``lost``
    when the connection ended first. ``orphan``: lost while the rank lives and still runs it."""

    __slots__ = ("channel", "seq", "reply", "lost", "orphan")

    def __init__(self, channel: Channel, seq: int) -> None:
        self.channel = channel
        self.seq = seq
        self.reply: Optional[List[Any]] = None
        self.lost = False
        self.orphan = False

    @property
    def done(self) -> bool:
        return self.reply is not None or self.lost

    def fileno(self) -> int:
        return self.channel.sock.fileno()

    def feed(self) -> None:
        """Take what the socket has (call when it is readable); set ``reply`` once whole, ``lost`` at its end."""
        channel = self.channel
        try:
            chunk = channel.sock.recv(1 << 20)
        except (BlockingIOError, socket.timeout):
            return
        except OSError:
            chunk = b""
        if not chunk:
            self.lost = channel.broken = True
            return
        channel.buf += chunk
        while len(channel.buf) >= HEADER.size:
            end = HEADER.size + HEADER.unpack_from(channel.buf)[0]
            if len(channel.buf) < end:
                return
            with memoryview(channel.buf) as view:
                reply = pickle.loads(view[HEADER.size:end])
            del channel.buf[:end]
            if reply[0] == self.seq:
                self.reply = reply


def wait_calls(calls: Sequence[ChannelCall], timeout: float) -> List[ChannelCall]:
    """The calls of ``calls`` done (answered or lost) once all are, or when ``timeout`` seconds have passed (as
    ``ray.wait`` for all of a cell's refs)."""
    waiting = [c for c in calls if not c.done]
    if waiting:
        deadline = time.monotonic() + timeout
        with selectors.DefaultSelector() as sel:
            for call in waiting:
                try:
                    sel.register(call, selectors.EVENT_READ)
                except (ValueError, OSError):  # its socket is closed: lost
                    call.lost = True
            while not all(c.done for c in waiting):
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                for key, _ in sel.select(left):
                    call = key.fileobj
                    call.feed()  # type: ignore[union-attr]
                    if call.done:  # type: ignore[union-attr]
                        sel.unregister(call)
    return [c for c in calls if c.done]


def _driver_ip() -> str:
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    return ray.util.get_node_ip_address()


def _connect(port: int, token: str, pid: int) -> Optional[Channel]:
    """A connection to a rank's channel on this machine, its pid checked; None when that fails."""
    try:
        sock = socket.create_connection(("127.0.0.1", port), timeout=CONNECT_S)
    except OSError:
        return None
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.sendall(token.encode()[:TOKEN_BYTES])
        hello = read_exact(sock, HELLO.size)
    except OSError:
        hello = None
    if hello is None or HELLO.unpack(hello) != (proof(token), pid):  # not the rank that gave the token
        sock.close()
        return None
    sock.settimeout(timing.CONTROL_CALL_S)  # a send waits at most this long; replies are read only when ready
    return Channel(sock, pid, token)


def channels_for(core: "GroupCore", ranks: Sequence[int]) -> Optional[Dict[int, Channel]]:
    """Every rank of ``ranks``' channel (opened where missing), or None when any of them cannot have one."""
    if not ranks or not settings.cell_channel():
        return None
    slots: Dict[int, Slot] = {r: core.slots[r] for r in ranks}
    if any(s.channel is UNAVAILABLE for s in slots.values()):
        return None
    for slot in slots.values():
        if isinstance(slot.channel, Channel) and slot.channel.broken:
            close_channel(slot)
    missing = [r for r, s in slots.items() if s.channel is None]
    if missing:
        here = _driver_ip()
        for r in missing:
            if slots[r].info.get("node_ip") != here or slots[r].info.get("pid") is None:
                slots[r].channel = UNAVAILABLE  # another machine: Ray calls
        missing = [r for r in missing if slots[r].channel is None]
        replies = FANOUT.ask([slots[r] for r in missing], lambda s: s.actor.open_channel.remote(),
                             timing.CONTROL_CALL_S, "the ranks' cell channels to open", ranks=missing)
        for r, reply in zip(missing, replies):  # the pid checked is the one the rank had when it was described
            channel = _connect(reply.value["port"], reply.value["token"], slots[r].info["pid"]) if reply.ok else None
            if channel is None:
                logger.debug("rank %d: no cell channel (%s); its cells go as Ray calls", r, reply.kind.value)
                slots[r].channel = UNAVAILABLE if reply.ok else None
            else:
                slots[r].channel = channel
    if any(not isinstance(s.channel, Channel) for s in slots.values()):
        return None
    return {r: s.channel for r, s in slots.items()}


@contextlib.contextmanager
def claimed(lines: Optional[Dict[int, Channel]]) -> Iterator[Optional[Dict[int, Channel]]]:
    """``lines`` while this thread holds every one of them (so two threads never read one socket), else None: one
    is in use (another thread's call), and the caller goes through Ray instead."""
    held: List[Channel] = []
    try:
        if lines is not None:
            for channel in lines.values():
                if not channel.lock.acquire(blocking=False):
                    lines = None
                    break
                held.append(channel)
        yield lines
    finally:
        for channel in held:
            channel.lock.release()


def close_channel(slot: Any) -> None:
    """Close ``slot``'s channel, if it has one (its worker is going, or its line broke): the next cell opens a new
    one."""
    channel = getattr(slot, "channel", None)
    if isinstance(channel, Channel):
        channel.close()
        slot.channel = None
