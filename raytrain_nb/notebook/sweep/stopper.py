"""The Tune ``Stopper`` the sweep dashboard controls: Tune asks it at each report which trials to end.

Wired as ``tune.RunConfig(stop=dash.stopper)`` (or inside ``CombinedStopper``). Tune's controller
calls ``stopper(trial_id, result)`` for every result and ``stopper.stop_all()`` at every step of its
loop, on the thread that runs ``tuner.fit()``; the dashboard's buttons mark trials from the kernel's
thread. A trial is thus stopped at its next report (Tune has no other way to stop a trial from
outside its controller), and the whole sweep within a step (~0.1 s).
"""
from __future__ import annotations

import threading
from typing import Any, Dict, Set

from ..._internal.extras import require

tune = require("ray.tune")


class DashboardStopper(tune.Stopper):
    """Stops the trials the dashboard asks for, and the whole sweep on request (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._wanted: Set[str] = set()
        self._stopped: Set[str] = set()
        self._asked: Set[str] = set()
        self._all = False

    def __call__(self, trial_id: str, result: Dict[str, Any]) -> bool:
        with self._lock:
            self._asked.add(trial_id)
            if self._all or trial_id in self._wanted:
                self._stopped.add(trial_id)
                return True
            return False

    def stop_all(self) -> bool:
        return self._all

    # -- the dashboard's side ------------------------------------------------------------------

    def request(self, trial_id: str) -> None:
        """End ``trial_id`` at its next report."""
        with self._lock:
            self._wanted.add(trial_id)

    def request_all(self) -> None:
        """End every trial and start no new one."""
        with self._lock:
            self._all = True

    def reset(self) -> None:
        """A new sweep starts: forget the last one's requests."""
        with self._lock:
            self._wanted.clear()
            self._stopped.clear()
            self._asked.clear()
            self._all = False

    def was_asked(self, trial_id: str) -> bool:
        """Whether Tune asked this stopper about ``trial_id`` (it is wired into the run)."""
        with self._lock:
            return trial_id in self._asked

    def stopped(self, trial_id: str) -> bool:
        """Whether this stopper told Tune to end ``trial_id``."""
        with self._lock:
            return trial_id in self._stopped

    # -- pickling (Tune saves its RunConfig with the Tuner) ---------------------------------------

    def __getstate__(self) -> Dict[str, Any]:
        with self._lock:
            return {"wanted": set(self._wanted), "all": self._all}

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__()
        self._wanted, self._all = set(state["wanted"]), bool(state["all"])
