"""Whether a ``fit()`` runs inside a Ray Tune trial (Ray Train V2's test), and what follows: its run name, its waits.

Inside a trial (a function trainable that builds a trainer and calls ``fit()``), the run gets a
name of its own without the user asking (the experiment's name and the trial's id, so a trial
that Tune retries reopens its own run and resumes from its newest checkpoint), and the group
waits for resources as long as the trial lives instead of failing after a deadline: Tune's
``max_concurrent_trials`` and trial resources decide how many trials run at once.
"""
from __future__ import annotations

import dataclasses
import re
import sys
from typing import Dict, Optional

from ..errors import ResourceError


@dataclasses.dataclass(frozen=True)
class TuneTrial:
    """The Tune trial this process runs.

    Attributes:
        trial_id: Tune's trial id (``"a1b2c_00003"``).
        trial_name: Tune's trial name (``"driver_fn_a1b2c_00003"``).
        experiment_name: the experiment's name (``tune.RunConfig(name=...)`` or Tune's default).
        resources: what the trial itself holds (its function's resources, ``tune.with_resources``).
    """

    trial_id: str
    trial_name: str
    experiment_name: str
    resources: Dict[str, float]

    def run_name(self) -> str:
        """The run name a trainer gets in this trial when ``RunConfig(name=...)`` is not set."""
        raw = f"{self.experiment_name}_{self.trial_id}" if self.experiment_name else self.trial_name
        return re.sub(r"[^A-Za-z0-9_.=+-]", "-", raw)[-200:].lstrip("-_.") or self.trial_id


def current_trial() -> Optional[TuneTrial]:
    """The Tune trial this process runs, or None outside Tune (and inside a Ray Train worker).

    Ray Train V2 asks the same: a Tune session exists in this process and has no world rank
    (a Ray Train V1 worker's session has one).
    """
    if "ray.tune" not in sys.modules:  # a trial's process has imported Tune to run the trainable
        return None
    from ray.train._internal.session import get_session  # ray: Tune's session, only where Tune is loaded

    sess = get_session()
    if sess is None or getattr(sess, "world_rank", 0) is not None:
        return None
    info = getattr(sess, "trial_info", None)
    if info is None:
        return None
    held = getattr(info, "resources", None)  # a PlacementGroupFactory (tune.with_resources) or a dict
    held = getattr(held, "required_resources", held) or {}
    resources = {str(k): float(v) for k, v in dict(held).items() if isinstance(v, (int, float))}
    return TuneTrial(str(info.id), str(info.name), str(getattr(info, "experiment_name", "") or ""), resources)


def check_beside_trial(trial: TuneTrial, bundle: Dict[str, float], count: int, total: Dict[str, float]) -> None:
    """Fail at once when ``count`` workers of ``bundle`` can never be placed next to the trial's own resources.

    Raises:
        ResourceError: naming the trial's resources, the workers' and the cluster's, and the fix.
    """
    for key, per in bundle.items():
        held = trial.resources.get(key, 0.0)
        need = per * count
        if held > 0 and held + need > total.get(key, 0.0) + 1e-9:
            raise ResourceError(
                f"Tune trial {trial.trial_name} holds {held:g} {key} and its {count} workers need {need:g} {key}, "
                f"but the cluster has {total.get(key, 0.0):g} {key}: the group could never start; give the trial "
                f"function fewer resources (tune.with_resources(driver_fn, {{'cpu': 0.1}})) or the workers fewer "
                "(ScalingConfig)")


#: Ray Train V1's ``tune.Tuner(trainer)`` is refused with this (``{cls}``: the trainer's class).
OLD_FORM = ("tune.Tuner({cls}(...)) is Ray Train V1's form (deprecated in Ray 2.60) and is not supported: "
            "build the {cls} inside a function, def driver_fn(config): {cls}(..., run_config=RunConfig("
            "callbacks=[raytrain_nb.tune.TuneReportCallback()])).fit(), and pass that function: "
            "tune.Tuner(driver_fn, param_space=...) (see docs/tune.md)")
