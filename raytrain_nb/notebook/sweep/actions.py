"""What each sweep dashboard button does: one call of the dashboard's stopper, and the line it shows.

Button -> call (programmatic twin): a trial's Stop -> ``stopper.request(trial_id)``
(``dash.stop(trial_id)``); Stop sweep -> ``stopper.request_all()`` (``dash.stop()``).
"""
from __future__ import annotations

from typing import Optional

from .model import SweepModel
from .stopper import DashboardStopper

LABELS = {"stop": "Stop", "stop_sweep": "Stop sweep"}


def act(model: SweepModel, stopper: DashboardStopper, trial_id: Optional[str] = None) -> str:
    """Stop ``trial_id`` (or, with None, the whole sweep); returns what happens, in one line.

    Raises:
        ValueError: ``trial_id`` is not a trial of this sweep (names the known ones).
    """
    if trial_id is None:
        stopper.request_all()
        model.request_stop_all()
        return "stopping the sweep: Tune ends every trial and starts no new one"
    if trial_id not in model.rows:
        known = ", ".join(model.rows) or "none yet"
        raise ValueError(f"no trial {trial_id!r} in this sweep (trials: {known})")
    stopper.request(trial_id)
    model.request_stop(trial_id)
    return f"stopping trial {trial_id}: Tune ends it at its next report; the others go on"
