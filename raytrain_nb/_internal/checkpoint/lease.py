"""One writer per run: a lease file in the run directory, taken when a run is opened for writing.

A group, a trainer or a resumed run takes the lease ``<run>/.lease`` (owner, host, pid, start and
renewal times) and renews it every :data:`RENEW_S` seconds while it lives; a second writer fails at
once naming the owner. A lease not renewed for :data:`STALE_S` seconds (its owner's machine was lost,
or the process was killed) is taken over with a warning, and so is one whose owner process on this
machine is gone. Readers (``%dist_checkpoints --run``, ``Result.from_path``) take no lease.

How atomic taking it is depends on the storage: on a local disk the lease is created with an
exclusive create (``O_EXCL``), so of two writers exactly one wins. On an object store it is written
with a conditional put where the filesystem offers one (``mode="create"``: S3's ``If-None-Match``);
where it does not, the lease is checked and then written, and two writers that start within the same
moment may both proceed (the README says so).
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Dict, Optional

from ..errors import RunInUseError
from ..processes import pid_alive
from .storage import is_local, join, resolve, to_url

logger = logging.getLogger(__name__)

LEASE_FILE = ".lease"
#: How often the owner renews its lease.
RENEW_S = 10.0
#: A lease not renewed for this long is taken over (its owner is gone).
STALE_S = 60.0



class RunLease:
    """The write lease of one run directory, held by this process while ``owner`` writes the run.

    Args:
        run_url: the run directory.
        owner: what holds it, for the message another writer sees (e.g. ``group run-x``).

    Raises:
        RunInUseError: another live writer holds the lease (naming it and the way out).
    """

    def __init__(self, run_url: str, owner: str) -> None:
        self.fs, run = resolve(run_url)
        self.run_url = run_url
        self.path = join(run, LEASE_FILE)
        self.token = uuid.uuid4().hex
        self.owner = owner
        self.started = time.time()
        self._stop = threading.Event()
        self._acquire()
        self._thread = threading.Thread(target=self._renew_loop, name="rtnb-lease", daemon=True)
        self._thread.start()

    def _record(self) -> bytes:
        return json.dumps({"token": self.token, "owner": self.owner, "host": socket.gethostname(),
                           "pid": os.getpid(), "started": self.started, "renewed": time.time()}).encode()

    def _read(self) -> Optional[Dict[str, Any]]:
        self.fs.invalidate_cache(self.path)
        try:
            data = json.loads(self.fs.cat_file(self.path).decode() or "{}")
        except FileNotFoundError:
            return None
        except (ValueError, UnicodeDecodeError):
            return {}  # torn or foreign: treated as stale below
        return data if isinstance(data, dict) else {}

    def _create(self) -> bool:
        """Create the lease file if none exists; False when one does."""
        if is_local(self.fs):
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            with os.fdopen(fd, "wb") as fh:
                fh.write(self._record())
            return True
        try:
            self.fs.pipe_file(self.path, self._record(), mode="create")  # a conditional put where offered
            return True
        except FileExistsError:
            return False
        except (TypeError, NotImplementedError, ValueError):  # no conditional put: check, then write
            if self.fs.exists(self.path):
                return False
            self.fs.pipe_file(self.path, self._record())
            return True

    def _stale_reason(self, held: Dict[str, Any]) -> Optional[str]:
        if not held.get("token"):
            return "it is unreadable"
        age = time.time() - float(held.get("renewed") or 0)
        if age > STALE_S:
            return f"it was last renewed {age:.0f} s ago (more than {STALE_S:g} s)"
        if held.get("host") == socket.gethostname() and isinstance(held.get("pid"), int) \
                and held["pid"] != os.getpid() and not pid_alive(held["pid"]):
            return f"its owner (pid {held['pid']} on this machine) has ended"
        return None

    def _acquire(self) -> None:
        for _ in range(3):
            if self._create():
                return
            held = self._read()
            if held is None:  # released meanwhile: try again
                continue
            why = self._stale_reason(held)
            if why is None:
                since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(float(held.get("started") or 0)))
                raise RunInUseError(
                    f"run {to_url(self.fs, self.path.rsplit('/', 1)[0])} is in use by {held.get('owner', '?')} "
                    f"(host {held.get('host', '?')}, pid {held.get('pid', '?')}, since {since}): pick another "
                    f"--name, or wait for it to end (an owner that stops renewing for {STALE_S:g} s is taken over)")
            logger.warning("taking over the run's lease %s: %s (held by %s, host %s, pid %s)",
                           to_url(self.fs, self.path), why, held.get("owner"), held.get("host"), held.get("pid"))
            try:
                self.fs.rm_file(self.path)
            except FileNotFoundError:
                pass
        raise RunInUseError(f"could not take the run's lease {to_url(self.fs, self.path)}: another writer keeps "
                            "taking it; pick another --name")

    def held(self) -> bool:
        """Whether this lease is still ours in storage."""
        held = self._read()
        return bool(held) and held.get("token") == self.token

    def _renew_loop(self) -> None:
        while not self._stop.wait(RENEW_S):
            try:
                if not self.held():
                    logger.error("the lease of run %s was taken over by another writer: stop writing to it",
                                 self.run_url)
                    return
                self.fs.pipe_file(self.path, self._record())
            except Exception as exc:  # noqa: BLE001 - renewal is retried at the next tick
                logger.warning("could not renew the lease of run %s: %s", self.run_url, exc)

    def release(self) -> None:
        """Stop renewing and remove the lease if it is still ours (idempotent)."""
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=5)
        try:
            if self.held():
                self.fs.rm_file(self.path)
        except Exception as exc:  # noqa: BLE001 - a lease left behind goes stale and is taken over
            logger.warning("could not release the lease of run %s: %s", self.run_url, exc)
