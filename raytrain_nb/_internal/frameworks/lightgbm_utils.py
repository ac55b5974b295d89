"""LightGBM's ``RayTrainReportCallback``, ``LightGBMCheckpoint`` and ``normalize_pandas_for_lightgbm`` (Ray's names)."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Dict, Optional

from ..checkpoint.checkpoint import Checkpoint, FrameworkCheckpoint
from ..extras import require
from .boosting_report import Metrics, PostProcess, ReportOptions, booster_checkpoint, flatten, report, saved

lightgbm = require("lightgbm")

CHECKPOINT_NAME = "model.txt"


def normalize_pandas_for_lightgbm(df: Any) -> Any:
    """Arrow-backed numeric and boolean pandas columns (``int64[pyarrow]``, which LightGBM refuses) as
    NumPy-nullable ones (``Int64``); other columns unchanged (Ray Train's helper)."""
    pd = require("pandas", "lightgbm")
    pa = require("pyarrow", "lightgbm")
    mapping = {}
    for column, dtype in df.dtypes.items():
        if not isinstance(dtype, pd.ArrowDtype):
            continue
        arrow = dtype.pyarrow_dtype
        if pa.types.is_signed_integer(arrow):
            mapping[column] = f"Int{arrow.bit_width}"
        elif pa.types.is_unsigned_integer(arrow):
            mapping[column] = f"UInt{arrow.bit_width}"
        elif pa.types.is_floating(arrow):
            mapping[column] = f"Float{arrow.bit_width}"
        elif pa.types.is_boolean(arrow):
            mapping[column] = "boolean"
    return df.astype(mapping) if mapping else df  # pandas 3 copies lazily (copy-on-write)


class RayTrainReportCallback:
    """Reports LightGBM's evaluation metrics after every round, and checkpoints the model (Ray Train's callback).

    Args:
        metrics: which metrics to report: a name, a list, or ``{reported name: LightGBM's name}``
            (``"<valid name>-<metric>"``, e.g. ``"eval-l2"``); default all.
        filename: the model's file in the checkpoint (default ``model.txt``).
        frequency: checkpoint every this many rounds (0: none during training).
        checkpoint_at_end: checkpoint after the last round.
        results_postprocessing_fn: turns the metrics dict into the one reported.

    Rank 0 saves the model; every rank reports. Load it with ``RayTrainReportCallback.get_model(checkpoint)``.
    """

    CHECKPOINT_NAME = CHECKPOINT_NAME

    def __init__(self, metrics: Metrics = None, filename: str = CHECKPOINT_NAME, frequency: int = 0,
                 checkpoint_at_end: bool = True, results_postprocessing_fn: PostProcess = None) -> None:
        self._options = ReportOptions(metrics, filename, frequency, checkpoint_at_end, results_postprocessing_fn)

    @classmethod
    def get_model(cls, checkpoint: Checkpoint, filename: str = CHECKPOINT_NAME) -> Any:
        """The ``lightgbm.Booster`` saved in ``checkpoint`` by this callback."""
        with checkpoint.as_directory() as path:
            return lightgbm.Booster(model_file=Path(path, filename).as_posix())

    @staticmethod
    def _eval_result(env: Any) -> Dict[str, Dict[str, Any]]:
        out: Dict[str, Dict[str, Any]] = {}
        for entry in env.evaluation_result_list:
            data, name, value = entry[0:3]
            if len(entry) > 4:  # lightgbm.cv: mean and stdv
                out.setdefault(data, {})[name + "-mean"] = value
                out[data][name + "-stdv"] = entry[4]
            else:
                out.setdefault(data, {})[name] = value
        return out

    def __call__(self, env: Any) -> None:
        metrics = self._options.report_dict(flatten(self._eval_result(env)))
        freq = self._options.frequency
        at_end = env.iteration == env.end_iteration - 1 and self._options.checkpoint_at_end
        if at_end or (freq and (env.iteration + 1) % freq == 0):
            with saved(env.model.save_model, self._options.filename) as checkpoint:
                report(metrics, checkpoint)
        else:
            report(metrics)


class LightGBMCheckpoint(FrameworkCheckpoint):
    """A :class:`~raytrain_nb.Checkpoint` holding a LightGBM model (Ray Train's ``LightGBMCheckpoint``)."""

    MODEL_FILENAME = "model.txt"

    @classmethod
    def from_model(cls, booster: Any, *, preprocessor: Any = None, path: Optional[str] = None) -> "LightGBMCheckpoint":
        """Save ``booster`` into ``path`` (default: a new temporary directory) and return its checkpoint.

        Raises:
            ValueError: ``path`` is not a directory, or a ``preprocessor`` is given (not supported).
        """
        return booster_checkpoint(cls, booster, preprocessor, path)

    def get_model(self) -> Any:
        """The ``lightgbm.Booster`` stored in this checkpoint."""
        with self.as_directory() as path:
            return lightgbm.Booster(model_file=Path(path, self.MODEL_FILENAME).as_posix())
