"""Processes of this machine: whether one still runs, this process's children, and ending some (what a failed Ray
start left)."""
from __future__ import annotations

import logging
import os
import signal
from typing import Set

logger = logging.getLogger(__name__)


def pid_alive(pid: int) -> bool:
    """Whether process ``pid`` of this host still runs (a zombie, ended but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)  # signal 0: only asks whether the process exists
    except ProcessLookupError:
        return False
    except OSError:  # it exists, owned by someone else
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):  # no /proc here: it exists
        return True


def children(running: str = "") -> Set[int]:
    """The pids of this process's children (Linux's /proc; empty elsewhere); with ``running``, only those
    whose command line contains it."""
    me, found = str(os.getpid()), set()
    try:
        entries = os.listdir("/proc")
    except OSError:
        return found
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[1] == me and (not running or running in _command_line(entry)):  # state, then the parent
            found.add(int(entry))
    return found


def end_children(pids: Set[int]) -> None:
    """End the processes a failed ``ray.init`` started and ``ray.shutdown`` did not know of (the GCS, the
    dashboard, monitors: about 250 MB, which a 2 GB pod cannot spare for the kernel's life)."""
    for pid in sorted(pids):
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, os.WNOHANG)
        except (OSError, ChildProcessError):
            pass
    if pids:
        logger.debug("ended %d process(es) a failed Ray start left: %s", len(pids), sorted(pids))


def _command_line(pid: str) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
