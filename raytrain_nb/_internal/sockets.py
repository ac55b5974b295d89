"""This process's TCP sockets, as ``/proc`` lists them: which ones a process group opened, and shutting them down
so that whoever blocks on them returns (how a rank stuck in a collective is released)."""
from __future__ import annotations

import os
import socket
from typing import Dict, Optional, Set

_ESTABLISHED = "01"


def _port(address: str) -> int:
    """The port of a ``/proc/net/tcp`` address (``0100007F:1F90`` -> 8080)."""
    return int(address.rsplit(":", 1)[1], 16)


def _inet_inodes(established_only: bool = False, port: Optional[int] = None) -> Set[str]:
    inodes: Set[str] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    parts = line.split()
                    if len(parts) <= 9 or (established_only and parts[3] != _ESTABLISHED):
                        continue
                    if port is None or port in (_port(parts[1]), _port(parts[2])):
                        inodes.add(parts[9])
        except OSError:
            continue
    return inodes


def inet_socket_fds(established_only: bool = False, port: Optional[int] = None) -> Dict[int, str]:
    """Map fd -> socket inode for this process's TCP sockets (listening ones too unless asked; only
    those with ``port`` at either end when given)."""
    inet = _inet_inodes(established_only, port)
    out: Dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inode = target[8:-1]
            if inode in inet:
                out[int(name)] = inode
    return out


def shutdown_sockets(fds: Dict[int, str]) -> None:
    """Shut down (not close: the owner still holds the fd) each socket, so whoever blocks on it returns."""
    for fd in fds:
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.detach()


def opened_between(before: Dict[int, str], after: Dict[int, str]) -> Dict[int, str]:
    """The sockets of ``after`` that were not open (as the same socket) in ``before``."""
    return {fd: ino for fd, ino in after.items() if before.get(fd) != ino}
