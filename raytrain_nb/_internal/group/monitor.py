"""Noticing dead and unresponsive workers, also while the group is idle.

Each worker holds a call in its ``monitor`` concurrency group that never
returns while the worker lives: when the process dies, Ray fails that call
and the monitor thread sees it within its wait interval. A heartbeat ping on
the control channel catches a worker that stops answering without dying
(SIGSTOP, a deadlock in C code holding the GIL).
"""
from __future__ import annotations

import logging
import re
import threading
import time
from typing import Any, Dict

from .state import SlotState
from .timing import DEFAULT_HEARTBEAT_TIMEOUT_S

logger = logging.getLogger(__name__)


def death_cause(exc: BaseException) -> str:
    """A short account of Ray's report of an actor's death (killed, OOM, node lost, exit code)."""
    text = " ".join(l.strip() for l in str(exc).splitlines() if l.strip())
    text = text.split(" Some common causes")[0]  # Ray's generic hints mention OOM whatever happened
    low = text.lower()
    if "node" in low and ("node has died" in low or "node died" in low or "node was" in low):
        return "its node was lost (" + re.sub(r".*?(The actor died because its node has died\.?)", r"\1", text)[:160] + ")"
    if "out of memory" in low or "outofmemory" in low or "running low on memory" in low:
        return "killed for using too much memory (OOM)"
    kind = re.search(r"Worker exit type: (\w+)", text)
    detail = re.search(r"Worker exit detail: (.*?)(?: Some common causes|$)", text)
    if kind or detail:
        parts = [kind.group(1) if kind else "", detail.group(1).strip().rstrip(".") if detail else ""]
        summary = ": ".join(p for p in parts if p)
        if "connection error code 2" in summary or "End of file" in summary:
            summary += " (the process was killed, e.g. SIGKILL or the OOM killer, or crashed)"
        return summary[:300]
    return (text or type(exc).__name__)[:300]


class HealthMonitor:
    """A daemon thread that marks a group's dead or silent workers.

    Args:
        core: the core of the group to watch (its slots; it marks them).
        heartbeat_timeout_s: a worker silent this long is reported unresponsive.
        interval_s: how often to check.
    """

    def __init__(self, core: Any, heartbeat_timeout_s: float = DEFAULT_HEARTBEAT_TIMEOUT_S,
                 interval_s: float = 0.5) -> None:
        self.core = core
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._watches: Dict[Any, Any] = {}  # watch ref -> actor
        self._pings: Dict[Any, Any] = {}  # actor -> (ping ref, sent at)
        self._last_ok: Dict[Any, float] = {}
        self._thread = threading.Thread(target=self._loop, name="rtnb-monitor", daemon=True)
        self._thread.start()

    def stop(self, wait_s: float = 0.0) -> None:
        """Stop checking. With ``wait_s``, wait up to that long for a check under way to end, so that nothing is
        marked dead after this returns (a shutdown then kills the workers)."""
        self._stop.set()
        if wait_s > 0 and self._thread is not threading.current_thread():
            self._thread.join(wait_s)
            if self._thread.is_alive():
                logger.warning("the health monitor's check did not end within %.0f s; shutting down all the same",
                               wait_s)

    def silent_for(self, actor: Any) -> float:
        """Seconds since ``actor`` last answered a heartbeat."""
        last = self._last_ok.get(actor)
        return 0.0 if last is None else time.monotonic() - last

    def _loop(self) -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        while not self._stop.is_set():
            try:
                self._check(ray)
            except Exception:  # never let the monitor die silently
                logger.exception("health monitor check failed")
            self._stop.wait(self.interval_s)

    def _check(self, ray: Any) -> None:
        actors = {s.actor for s in self.core.slots if s.state != SlotState.DEAD}
        known = set(self._watches.values())
        for actor in actors - known:
            self._watches[actor.watch.remote()] = actor
            self._last_ok[actor] = time.monotonic()
        for ref, actor in list(self._watches.items()):
            if actor not in actors:
                del self._watches[ref]
                self._pings.pop(actor, None)
                self._last_ok.pop(actor, None)
        if self._watches:
            ready, _ = ray.wait(list(self._watches), num_returns=len(self._watches), timeout=0)
            for ref in ready:
                actor = self._watches.pop(ref)
                try:
                    ray.get(ref, timeout=1.0)  # ready: it only fetches the error
                except ray.exceptions.RayActorError as exc:
                    self.core.mark_dead(actor, death_cause(exc))
                except Exception as exc:  # noqa: BLE001
                    self.core.mark_dead(actor, str(exc)[:300])
        now = time.monotonic()
        pings = {self._pings[a][0]: a for a in actors if a in self._pings}
        answered = set()
        if pings:  # every ping in flight looked at in one call (not one call per rank)
            ready, _ = ray.wait(list(pings), num_returns=len(pings), timeout=0)
            answered = {pings[ref] for ref in ready}
        for actor in actors:
            pending = self._pings.get(actor)
            if pending is None:
                self._pings[actor] = (actor.ping.remote(), now)
                continue
            if actor in answered:
                self._last_ok[actor] = now
                self._pings[actor] = (actor.ping.remote(), now)
            elif now - self._last_ok.get(actor, now) > self.heartbeat_timeout_s:
                self.core.mark_unresponsive(actor, now - self._last_ok[actor])
