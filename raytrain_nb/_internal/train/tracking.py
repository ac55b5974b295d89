"""``MLflowLoggerCallback`` and ``WandbLoggerCallback``: run callbacks that log one ``fit()`` into the run's one
tracked run, at the run's report index, off the step path (see :mod:`raytrain_nb._internal.tracking`).

The same callback object can be handed to a group (``group.track(callback)``): its settings are :attr:`spec`.
"""
from __future__ import annotations

import logging
import warnings
from typing import Any, Dict, List, Optional, Sequence

from ..tracking.tracker import CLOSE_WAIT_S, Tracker, TrackerSpec, check_installed, open_tracker
from .callbacks import TrainRunContext, UserCallback

logger = logging.getLogger(__name__)


class TrackingCallback(UserCallback):
    """Drives one :class:`Tracker` per ``fit()``: the config at setup, each report at its index, a note for each
    failed attempt, the end (``FAILED`` when the run ended on a failure)."""

    def __init__(self, spec: TrackerSpec, log_params_at_end: bool = False) -> None:
        self.spec = spec
        self.log_params_at_end = log_params_at_end
        self.tracker: Optional[Tracker] = None
        self._config: Optional[Dict[str, Any]] = None
        self._failed = False

    @property
    def run_id(self) -> Optional[str]:
        """The tracked run's id, once it is open."""
        return self.tracker.run_id if self.tracker is not None else None

    def setup(self, context: TrainRunContext) -> None:
        self._config = self._params(context.train_loop_config)
        self._failed = False
        self.tracker = open_tracker(self.spec, context.run_dir, context.name,
                                    None if self.log_params_at_end else self._config)

    def _params(self, config: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        return dict(config or {})

    def after_report(self, run_context: TrainRunContext, metrics: List[Dict[str, Any]],
                     checkpoint: Optional[Any]) -> None:
        if self.tracker is None or run_context.report_index is None:
            return
        self._failed = False
        where = None
        if checkpoint is not None:
            path = str(getattr(checkpoint, "path", checkpoint))
            where = (path.rstrip("/").rsplit("/", 1)[-1], path)
        self.tracker.log_report(run_context.report_index, metrics, checkpoint=where)

    def after_exception(self, run_context: TrainRunContext, worker_exceptions: Dict[int, BaseException]) -> None:
        self._failed = True
        if self.tracker is not None:
            ranks = ", ".join(str(r) for r in sorted(worker_exceptions)) or "?"
            first = next(iter(worker_exceptions.values()), None)
            what = f"{type(first).__name__}: {str(first).strip().splitlines()[0][:200] if str(first).strip() else ''}"
            self.tracker.note("failure", f"rank(s) {ranks} failed ({what}); the next attempt resumes from the newest "
                                         "checkpoint and its reports log at later steps")

    def teardown(self) -> None:
        if self.tracker is None:
            return
        if self.log_params_at_end and self._config:
            self.tracker.log_params(self._config)
        self.tracker.close(failed=self._failed, wait_s=CLOSE_WAIT_S)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait up to ``timeout_s`` for everything queued to be logged (True when it was)."""
        return self.tracker.flush(timeout_s) if self.tracker is not None else True


class MLflowLoggerCallback(TrackingCallback):
    """Logs a ``fit()`` to MLflow (Ray's ``MLflowLoggerCallback`` arguments; see
    :mod:`raytrain_nb.integrations.mlflow`)."""

    def __init__(self, tracking_uri: Optional[str] = None, *, registry_uri: Optional[str] = None,
                 experiment_name: Optional[str] = None, tags: Optional[Dict] = None,
                 tracking_token: Optional[str] = None, save_artifact: bool = False,
                 log_params_on_trial_end: bool = False) -> None:
        check_installed("mlflow")
        super().__init__(TrackerSpec("mlflow", dict(
            tracking_uri=tracking_uri, registry_uri=registry_uri, experiment_name=experiment_name, tags=tags,
            tracking_token=tracking_token, save_artifact=save_artifact)), log_params_at_end=log_params_on_trial_end)
        self.tracking_uri = tracking_uri
        self.experiment_name = experiment_name
        self.tags = tags
        self.should_save_artifact = save_artifact


class WandbLoggerCallback(TrackingCallback):
    """Logs a ``fit()`` to Weights & Biases (Ray's ``WandbLoggerCallback`` arguments; see
    :mod:`raytrain_nb.integrations.wandb`)."""

    def __init__(self, project: Optional[str] = None, group: Optional[str] = None,
                 api_key_file: Optional[str] = None, api_key: Optional[str] = None,
                 excludes: Optional[List[str]] = None, log_config: bool = False, upload_checkpoints: bool = False,
                 save_checkpoints: bool = False, upload_timeout: int = 1800, video_kwargs: Optional[dict] = None,
                 image_kwargs: Optional[dict] = None, **kwargs: Any) -> None:
        check_installed("wandb")
        if save_checkpoints:
            warnings.warn("`save_checkpoints` is deprecated. Use `upload_checkpoints` instead.", DeprecationWarning,
                          stacklevel=2)
            upload_checkpoints = True
        super().__init__(TrackerSpec("wandb", dict(
            project=project, group=group, api_key_file=api_key_file, api_key=api_key, excludes=excludes,
            upload_checkpoints=upload_checkpoints, **kwargs)))
        self.project = project
        self.group = group
        self.excludes: Sequence[str] = excludes or []
        self.log_config = log_config
        self.upload_checkpoints = upload_checkpoints
        self.upload_timeout = upload_timeout
        self.video_kwargs = video_kwargs or {}
        self.image_kwargs = image_kwargs or {}
        self.kwargs = kwargs

    def _params(self, config: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        return {k: v for k, v in (config or {}).items() if k not in self.excludes}
