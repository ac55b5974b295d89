"""XGBoost's ``RayTrainReportCallback`` and ``XGBoostCheckpoint`` (Ray Train's names and behaviour)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from ..checkpoint.checkpoint import Checkpoint, FrameworkCheckpoint
from ..extras import require
from .boosting_report import Metrics, PostProcess, ReportOptions, booster_checkpoint, flatten, report, saved

xgboost = require("xgboost")

CHECKPOINT_NAME = "model.ubj"


class RayTrainReportCallback(xgboost.callback.TrainingCallback):
    """Reports XGBoost's evaluation metrics after every round, and checkpoints the model (Ray Train's callback).

    Args:
        metrics: which metrics to report: a name, a list, or ``{reported name: XGBoost's name}``
            (XGBoost's names are ``"<eval set>-<metric>"``, e.g. ``"validation-rmse"``); default all.
        filename: the model's file in the checkpoint (default ``model.ubj``).
        frequency: checkpoint every this many rounds (0: none during training).
        checkpoint_at_end: checkpoint after the last round.
        results_postprocessing_fn: turns the metrics dict into the one reported.

    Rank 0 saves the model; every rank reports (a checkpoint is committed once every rank reported).
    Load a reported model with ``RayTrainReportCallback.get_model(result.checkpoint)``.
    """

    CHECKPOINT_NAME = CHECKPOINT_NAME

    def __init__(self, metrics: Metrics = None, filename: str = CHECKPOINT_NAME, frequency: int = 0,
                 checkpoint_at_end: bool = True, results_postprocessing_fn: PostProcess = None) -> None:
        super().__init__()
        self._options = ReportOptions(metrics, filename, frequency, checkpoint_at_end, results_postprocessing_fn)
        self._evals_log: Optional[Dict[str, Any]] = None
        self._last_checkpoint_iteration: Optional[int] = None

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Any:
        """The ``xgboost.Booster`` saved in ``checkpoint`` by this callback."""
        with checkpoint.as_directory() as path:
            booster = xgboost.Booster()
            booster.load_model(Path(path, filename).as_posix())
            return booster

    def _report_dict(self, evals_log: Optional[Dict[str, Any]]) -> Dict[str, Any]:
        results = {k: v[-1] if isinstance(v, (list, tuple)) else v for k, v in flatten(evals_log or {}).items()}
        return self._options.report_dict(results)

    def _save_and_report(self, metrics: Dict[str, Any], model: Any) -> None:
        with saved(model.save_model, self._options.filename) as checkpoint:
            report(metrics, checkpoint)

    def after_iteration(self, model: Any, epoch: int, evals_log: Dict[str, Any]) -> bool:
        self._evals_log = evals_log
        metrics = self._report_dict(evals_log)
        freq = self._options.frequency
        if freq and (epoch + 1) % freq == 0:
            self._last_checkpoint_iteration = epoch
            self._save_and_report(metrics, model)
        else:
            report(metrics)
        return False

    def after_training(self, model: Any) -> Any:
        if not self._options.checkpoint_at_end:
            return model
        if self._last_checkpoint_iteration is not None and \
                model.num_boosted_rounds() - 1 == self._last_checkpoint_iteration:
            return model  # the last round was checkpointed already
        self._save_and_report(self._report_dict(self._evals_log) if self._evals_log else {}, model)
        return model


class XGBoostCheckpoint(FrameworkCheckpoint):
    """A :class:`~raytrain_nb.Checkpoint` holding an XGBoost model (Ray Train's ``XGBoostCheckpoint``)."""

    MODEL_FILENAME = "model.json"

    @classmethod
    def from_model(cls, booster: Any, *, preprocessor: Any = None, path: Optional[str] = None) -> "XGBoostCheckpoint":
        """Save ``booster`` into ``path`` (default: a new temporary directory) and return its checkpoint.

        Raises:
            ValueError: ``path`` is not a directory, or a ``preprocessor`` is given (not supported).
        """
        return booster_checkpoint(cls, booster, preprocessor, path)

    def get_model(self) -> Any:
        """The ``xgboost.Booster`` stored in this checkpoint."""
        with self.as_directory() as path:
            booster = xgboost.Booster()
            booster.load_model(Path(path, self.MODEL_FILENAME).as_posix())
            return booster
