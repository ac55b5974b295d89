"""``setup_mlflow`` / ``setup_wandb`` on the workers, as Ray's: rank 0 gets the library, every other rank a no-op.

What they return logs where the user calls it, on the user's step path (as in Ray); the callbacks and
``group.track`` are what log off the step path and survive recovery.
"""
from __future__ import annotations

import os
from typing import Any, Dict, Optional

from ..extras import require
from ..worker.session import current_session
from .reports import flatten, plain_params

_PLAIN = (bool, int, float, str, type(None), list, tuple)


class NoopModule:
    """What a rank other than 0 gets from ``setup_mlflow``: every attribute and call does nothing."""

    def __getattr__(self, item: str) -> "NoopModule":
        return NoopModule()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        return None


def _rank_and_run() -> "tuple[Optional[int], str]":
    """This worker's rank and the run's name (None and "" outside a worker)."""
    session = current_session()
    if session is None:
        return None, ""
    return session.context.world_rank, session.context.experiment_name


def setup_mlflow(config: Optional[Dict] = None, tracking_uri: Optional[str] = None,
                 registry_uri: Optional[str] = None, experiment_id: Optional[str] = None,
                 experiment_name: Optional[str] = None, tracking_token: Optional[str] = None,
                 artifact_location: Optional[str] = None, run_name: Optional[str] = None,
                 create_experiment_if_not_exists: bool = False, tags: Optional[Dict] = None,
                 rank_zero_only: bool = True) -> Any:
    """Ray's ``setup_mlflow``: see :func:`raytrain_nb.integrations.mlflow.setup_mlflow`."""
    rank, run = _rank_and_run()
    if rank_zero_only and rank not in (None, 0):
        return NoopModule()
    mlflow = require("mlflow")
    if tracking_token:
        os.environ["MLFLOW_TRACKING_TOKEN"] = tracking_token
    if tracking_uri is not None:
        mlflow.set_tracking_uri(tracking_uri)
    if registry_uri is not None:
        mlflow.set_registry_uri(registry_uri)
    experiment = _experiment(mlflow, experiment_id or os.environ.get("MLFLOW_EXPERIMENT_ID"),
                             experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME"),
                             artifact_location, create_experiment_if_not_exists)
    if mlflow.active_run() is None:
        mlflow.start_run(run_name=run_name or experiment_name or run or None, experiment_id=experiment,
                         tags=tags or {})
    params = plain_params(config)
    if params:
        mlflow.log_params(params)
    return mlflow


def _experiment(mlflow: Any, experiment_id: Optional[str], experiment_name: Optional[str],
                artifact_location: Optional[str], create: bool) -> Optional[str]:
    """The experiment's id: the given id, else the named one (made when ``create``), else MLflow's default."""
    if experiment_id is not None:
        return experiment_id
    if not experiment_name:
        return None
    found = mlflow.get_experiment_by_name(experiment_name)
    if found is not None:
        return found.experiment_id
    if not create:
        raise ValueError(f"setup_mlflow(experiment_name={experiment_name!r}): no such MLflow experiment; pass "
                         "create_experiment_if_not_exists=True or create it first")
    return mlflow.create_experiment(experiment_name, artifact_location=artifact_location)


def setup_wandb(config: Optional[Dict] = None, api_key: Optional[str] = None, api_key_file: Optional[str] = None,
                rank_zero_only: bool = True, **kwargs: Any) -> Any:
    """Ray's ``setup_wandb``: see :func:`raytrain_nb.integrations.wandb.setup_wandb`."""
    rank, run = _rank_and_run()
    wandb = require("wandb")
    if rank_zero_only and rank not in (None, 0):
        return wandb.init(mode="disabled")
    if api_key_file:
        with open(os.path.expanduser(api_key_file)) as f:
            api_key = f.readline().strip()
    if api_key:
        os.environ["WANDB_API_KEY"] = api_key
    init: Dict[str, Any] = {"project": os.environ.get("WANDB_PROJECT") or "raytrain_nb",
                            "group": os.environ.get("WANDB_RUN_GROUP") or run or None, "name": run or None,
                            "config": {k: v for k, v in flatten(config or {}).items() if isinstance(v, _PLAIN)}, "reinit": "create_new"}
    init.update(kwargs)
    return wandb.init(**init)
