"""The custodian of a keep-alive group: a detached actor on the cluster that outlives the group's driver.

One per keep-alive group, named ``rtnb-custodian:<run>`` in the namespace every driver of ours joins. It holds what
a new driver needs to take the group over (the workers' and placement groups' handles, and the driver's own state
pickled: config, cell history, pushed values, metrics), hears its driver's heartbeat, and is the group's owner
record: a driver takes the group over by claiming it here (refused while the owner still beats, unless stolen).
While no driver beats, it renews the run's lease itself (``checkpoint/lease.py``: it takes over the lease of a
driver that is gone) until the keep-alive runs out; then it ends the group: the workers stop, the placement groups
are released, the lease is given back, a line in ``<run>/events.log`` says when and why, and it exits. The supervisor
of the shared instance (``supervisor.py``) stops the instance once no custodian and no driver is left.
"""
from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from typing import Any, Dict, List, Optional

from ..checkpoint.lease import LEASE_FILE, RunLease
from ..checkpoint.storage import join, resolve
from ..processes import pid_alive

logger = logging.getLogger(__name__)

#: Prefix of a custodian's actor name (the supervisor counts them).
PREFIX = "rtnb-custodian:"
#: A driver that has not beaten this long is gone (it beats every ``survival.BEAT_S``).
OWNER_SILENT_S = 4.0
#: How often the custodian looks at its driver and its keep-alive.
WATCH_S = 0.5
#: The thread that ends an ended custodian's actor process (only an actor's: see _exit_soon).
EXIT_THREAD = "rtnb-custodian-exit"
EVENTS = "events.log"


def actor_name(run: str) -> str:
    return PREFIX + run


def log_event(run_url: str, line: str) -> None:
    """Append ``<UTC time> <line>`` to the run's ``events.log``."""
    fs, path = resolve(run_url)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        with fs.open(join(path, EVENTS), "a") as fh:
            fh.write(f"{stamp} {line}\n")
    except Exception as exc:  # noqa: BLE001 - an object store without append: said in the log
        logger.warning("cannot append to %s/%s: %s", run_url, EVENTS, exc)


def describe_owner(owner: Dict[str, Any]) -> str:
    return f"kernel pid {owner.get('pid', '?')} on {owner.get('host', '?')}"


def ended_here(owner: Dict[str, Any]) -> bool:
    """Whether the owner is a process of this machine that has ended: a killed kernel is gone at once, before its
    silence says so (a restarted kernel attaches within a second or two)."""
    pid = owner.get("pid")
    return owner.get("host") == socket.gethostname() and isinstance(pid, int) and not pid_alive(pid)


class Custodian:
    """Keeps one keep-alive group while it has no driver (a plain class: ``ray.remote`` wraps it when made).

    Args:
        run: the run's name; url: its directory; keep_alive_s: how long the group lives without a driver;
        owner: the driver that made it (``token``, ``pid``, ``host``).
    """

    def __init__(self, run: str, url: str, keep_alive_s: float, owner: Dict[str, Any]) -> None:
        self.run, self.url, self.keep_alive_s = run, url, float(keep_alive_s)
        self.owner = dict(owner)
        self.created = self.last_beat = self.idle_since = time.time()
        self.busy = False
        self.detached_at: Optional[float] = None
        self.workers: List[Any] = []
        self.pgs: List[Any] = []
        self.state: bytes = b""
        self.seq = 0
        self.taken: Dict[str, str] = {}  # an old owner's token -> what it is told at its next beat
        self.lease: Optional[RunLease] = None
        self._lock = threading.RLock()
        self._ended = False
        threading.Thread(target=self._watch, name="rtnb-custodian", daemon=True).start()

    # -- the driver's calls ---------------------------------------------------------------------

    def beat(self, token: str, busy: bool) -> str:
        """The owner is alive ("" back); another driver hears why it no longer owns the group."""
        with self._lock:
            if token != self.owner.get("token"):
                return self.taken.get(token, f"group {self.run} is owned by {describe_owner(self.owner)} now")
            now = time.time()
            self.last_beat = now
            if busy != self.busy or busy:
                self.idle_since = now
            self.busy = busy
            return ""

    def update(self, token: str, seq: int, workers: List[Any], pgs: List[Any], state: bytes) -> bool:
        """The owner's latest handles and pickled state (after each change of the group; the highest ``seq`` wins)."""
        with self._lock:
            if token != self.owner.get("token") or seq <= self.seq:
                return False
            self.seq, self.workers, self.pgs, self.state = seq, list(workers), list(pgs), state
            return True

    def detach(self, token: str, keep_alive_s: Optional[float]) -> float:
        """The owner leaves now (it gave the lease back); returns the keep-alive that runs from now."""
        with self._lock:
            if token == self.owner.get("token") and self.detached_at is None:
                if keep_alive_s is not None:
                    self.keep_alive_s = float(keep_alive_s)
                self._went(time.time(), "detached by its driver")
            return self.keep_alive_s

    def claim(self, owner: Dict[str, Any], steal: bool) -> Dict[str, Any]:
        """Hand the group to ``owner``: refused (``refused``: why) while the owner beats, unless ``steal``."""
        with self._lock:
            if self._ended:
                return {"refused": f"group {self.run} has ended"}
            now = time.time()
            alive = self._owner_alive(now)
            old = self.owner
            if alive and not steal:
                return {"refused": f"group {self.run} is attached to {describe_owner(old)}, which is alive: "
                                   "%dist_attach --steal takes it over (that kernel's next command is refused), or "
                                   "%dist_detach there first"}
            if alive:
                self.taken[old.get("token", "")] = (
                    f"group {self.run} was taken over by {describe_owner(owner)} at "
                    f"{time.strftime('%H:%M:%S', time.localtime(now))} (%dist_attach --steal): this kernel no "
                    "longer drives it; %dist_attach --steal takes it back")
            if self.lease is not None:
                self.lease.release()
                self.lease = None
            left = self.left(now)
            self.owner, self.last_beat, self.detached_at, self.seq = dict(owner), now, None, 0
            log_event(self.url, f"attached by {describe_owner(owner)}" + (" (stolen)" if alive else ""))
            return {"workers": self.workers, "pgs": self.pgs, "state": self.state, "keep_alive_s": self.keep_alive_s,
                    "stolen_from": describe_owner(old) if alive else "", "keep_alive_left": left}

    def _owner_alive(self, now: float) -> bool:
        """The owner beat within :data:`OWNER_SILENT_S` and is not a process of this machine that has ended."""
        return self.detached_at is None and now - self.last_beat < OWNER_SILENT_S and not ended_here(self.owner)

    def set_keep_alive(self, token: str, keep_alive_s: float) -> None:
        with self._lock:
            if token == self.owner.get("token"):
                self.keep_alive_s = float(keep_alive_s)

    def describe(self) -> Dict[str, Any]:
        """One row of ``%dist_groups``."""
        with self._lock:
            now = time.time()
            return {"run": self.run, "url": self.url, "size": len(self.workers), "owner": describe_owner(self.owner),
                    "owner_alive": self._owner_alive(now),
                    "age_s": now - self.created, "idle_s": None if self.busy else now - self.idle_since,
                    "keep_alive_s": self.keep_alive_s, "keep_alive_left_s": self.left(now)}

    def end(self, token: str, reason: str) -> bool:
        """The owner shut the group down (its workers are gone): the custodian goes too."""
        with self._lock:
            if token != self.owner.get("token"):
                return False
            self._finish(reason, stop_workers=False)
            return True

    # -- on its own ----------------------------------------------------------------------------

    def left(self, now: float) -> Optional[float]:
        """Seconds of keep-alive left while no driver is attached (None while one is)."""
        return None if self.detached_at is None else max(0.0, self.detached_at + self.keep_alive_s - now)

    def stop_watching(self) -> None:
        """Stop the keep-alive clock's thread without ending the group (a custodian used outside an actor)."""
        self._ended = True

    def _went(self, at: float, how: str) -> None:
        self.detached_at = at
        log_event(self.url, f"{how}: the group lives on without a driver for {self.keep_alive_s:g} s "
                            f"(%dist_attach {self.run} takes it over)")

    def _watch(self) -> None:
        while not self._ended:
            time.sleep(WATCH_S)  # the custodian's own clock; nothing to wait on
            with self._lock:
                now = time.time()
                if self.detached_at is None and now - self.last_beat > OWNER_SILENT_S:
                    self._went(self.last_beat, f"{describe_owner(self.owner)} stopped answering (kernel ended)")
                if self.detached_at is None:
                    continue
                if self.lease is None:
                    try:
                        self.lease = RunLease(self.url, f"the custodian of keep-alive group {self.run!r}")
                    except Exception as exc:  # noqa: BLE001 - the old owner's lease is not stale yet: next tick
                        logger.debug("cannot take the lease of %s yet: %s", self.run, exc)
                if now - self.detached_at >= self.keep_alive_s:
                    self._finish(f"ended: the keep-alive of {self.keep_alive_s:g} s ran out with no driver attached "
                                 f"(no driver since {time.strftime('%H:%M:%S', time.gmtime(self.detached_at))} UTC)",
                                 stop_workers=True)

    def _drop_owners_lease(self) -> None:
        """The lease its last driver left (not taken yet: that process was not reaped): the run has no writer now."""
        fs, path = resolve(self.url)
        lease = join(path, LEASE_FILE)
        try:
            held = json.loads(fs.cat_file(lease).decode() or "{}")
            if held.get("pid") == self.owner.get("pid") and held.get("host") == self.owner.get("host"):
                fs.rm_file(lease)
        except Exception as exc:  # noqa: BLE001 - none, or another writer's: left as it is
            logger.debug("the lease of %s stays: %s", self.run, exc)

    def _finish(self, reason: str, stop_workers: bool) -> None:
        import ray  # ray: this runs in a Ray actor
        from ray.util.placement_group import remove_placement_group  # ray: as above

        self._ended = True
        if stop_workers:
            for actor in self.workers:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # noqa: BLE001 - already gone
                    pass
            for pg in self.pgs:
                try:
                    remove_placement_group(pg)
                except Exception as exc:  # noqa: BLE001 - said, and the instance's end frees it anyway
                    logger.warning("could not release placement group %s: %s", pg.id.hex(), exc)
        if self.lease is not None:
            self.lease.release()
            self.lease = None
        elif stop_workers:
            self._drop_owners_lease()
        log_event(self.url, f"group {self.run} {reason}")
        threading.Thread(target=_exit_soon, name=EXIT_THREAD, daemon=True).start()


def _exit_soon() -> None:
    """End this actor's process once the call that ended it has answered (its name is free again). Only an actor's
    process: a Custodian built in any other process (a driver, a test) never ends that process."""
    import ray  # ray: the custodian runs in a Ray actor

    if not ray.is_initialized() or ray.get_runtime_context().get_actor_id() is None:  # (the context would init Ray)
        return
    time.sleep(0.2)  # let the reply of end() leave first
    os._exit(0)
