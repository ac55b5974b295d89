"""The shared Ray instance that keep-alive groups run on: our record of it, and starting it outside the kernel.

``ray.init()`` starts a head that dies with its driver (a reaper, ``PR_SET_PDEATHSIG``), and Jupyter signals the
kernel's whole process group on interrupt, restart and kill. A group that must outlive its kernel therefore runs
on an instance started by ``supervisor.py`` in a session of its own (``setsid``), which writes a record
(``instance.json`` in :func:`settings.instance_dir`: the GCS address, the namespace, the supervisor's pid) that the
next kernel reads to connect. Never ``ray.init(address="auto")``: with several instances on a machine it picks
one arbitrarily, and an instance started by ``ray.init()`` writes no ``ray_current_cluster``. Finding or starting
is serialised by a lock file, so two kernels starting at once share one instance.
"""
from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import secrets
import subprocess
import sys
import time
from typing import Any, Dict, Iterator, Optional

from . import settings
from .errors import GroupError
from .processes import pid_alive

logger = logging.getLogger(__name__)

#: The Ray namespace of every detached actor of ours (workers, custodians): another driver finds them only there.
NAMESPACE = "raytrain_nb"
RECORD = "instance.json"
#: How long a kernel waits for the supervisor to bring the instance up (a loaded machine takes 10-20 s).
START_S = 120.0


def record_path() -> str:
    return os.path.join(settings.instance_dir(), RECORD)


def read_record() -> Optional[Dict[str, Any]]:
    """The record of a running shared instance, or None (none written, or its supervisor has ended)."""
    try:
        with open(record_path()) as fh:
            record = json.load(fh)
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("pid"), int) or not pid_alive(record["pid"]):
        return None
    return record


def write_record(record: Dict[str, Any]) -> None:
    """Write the record atomically (readable by its owner only: it names how to reach the instance)."""
    folder = settings.instance_dir()
    os.makedirs(folder, mode=0o700, exist_ok=True)
    tmp = os.path.join(folder, f".{RECORD}.{os.getpid()}")
    with open(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as fh:
        json.dump(record, fh)
    os.replace(tmp, record_path())


def remove_record(pid: int) -> None:
    """Remove the record if it still names the supervisor ``pid``."""
    try:
        with open(record_path()) as fh:
            if json.load(fh).get("pid") == pid:
                os.unlink(record_path())
    except (OSError, ValueError, AttributeError):
        pass


@contextlib.contextmanager
def _locked() -> Iterator[None]:
    folder = settings.instance_dir()
    os.makedirs(folder, mode=0o700, exist_ok=True)
    with open(os.path.join(folder, "instance.lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # held for seconds at most: the start below has a deadline
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


def find_or_start() -> Dict[str, Any]:
    """The shared instance's record; the instance is started first when none runs.

    Raises:
        GroupError: the supervisor did not bring it up within :data:`START_S` (names its log).
    """
    with _locked():
        record = read_record()
        if record is not None:
            return record
        return _start()


def _start() -> Dict[str, Any]:
    """Start the supervisor in a session of its own, and not as our child: it forks and its parent exits at once,
    so neither Jupyter's signal to the kernel's process group nor ipykernel's ending of the kernel's children
    reaches it (nor the Ray processes it starts)."""
    folder = settings.instance_dir()
    log = os.path.join(folder, "supervisor.log")
    launch = secrets.token_hex(8)
    with open(log, "ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "raytrain_nb._internal.supervisor", launch],
                                stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                close_fds=True)
    proc.wait(timeout=START_S)  # the launcher only forks
    deadline = time.monotonic() + START_S
    while time.monotonic() < deadline:
        record = read_record()
        if record is not None and record.get("launch") == launch:
            logger.info("started the shared Ray instance at %s (supervisor pid %d)", record["address"], record["pid"])
            return record
        if record is None and _failed(log, launch):
            raise GroupError(f"the shared Ray instance did not start: see {log}")
        time.sleep(0.2)  # polling a file the supervisor writes once it is up; the loop has a deadline
    raise GroupError(f"the shared Ray instance did not come up within {START_S:g} s (the machine may be loaded): "
                     f"see {log}, then try again")


def _failed(log: str, launch: str) -> bool:
    """Whether the supervisor of ``launch`` wrote that it gave up (its last line in the log)."""
    try:
        with open(log, "rb") as fh:
            fh.seek(max(0, os.path.getsize(log) - 4096))
            return f"supervisor {launch} failed".encode() in fh.read()
    except OSError:
        return False
