"""``Result`` of ``fit()``, with Ray Train's fields (V2's ``return_value`` too).

A result is read back from the run directory alone (``Result.from_path``): the checkpoint
index ``checkpoints.json`` and every reported metric in ``metrics.jsonl``.

Example::

    result = trainer.fit()
    result.metrics["loss"], result.checkpoint, result.metrics_dataframe.tail()
    Result.from_path(result.path).best_checkpoints
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple

from ..checkpoint.checkpoint import Checkpoint
from ..checkpoint.manager import CheckpointManager
from ..checkpoint.metrics_log import read_metrics
from ..checkpoint.storage import resolve, to_url
from ..errors import CheckpointError
from ..validate import not_supported

#: Key under which metrics.jsonl keeps the report time; ``timestamp`` in the dataframe.
_TIME_KEY = "_time"




@dataclasses.dataclass(init=False)
class Result:
    """What a run produced (Ray Train's ``Result``; its arguments in Ray Train's order).

    Attributes:
        metrics: the last metrics reported by rank 0 (None if nothing was reported).
        checkpoint: the newest committed checkpoint (None if none was reported).
        error: the error that ended the run (a ``TrainingFailedError``), or None.
        path: the run directory (local path or URL); None in local mode (``ScalingConfig(num_workers=0)``).
        metrics_dataframe: every metric rank 0 reported (read from the run directory unless given).
        best_checkpoints: ``(Checkpoint, metrics)`` pairs, best first by
            ``checkpoint_score_attribute`` (newest first without one).
        filesystem: the fsspec filesystem of ``path`` (``_storage_filesystem`` when built).
        return_value: what the training function returned on rank 0 (None when it returned nothing, or the
            run failed); it must pickle (rank 0 sends it to the driver).
    """

    metrics: Optional[Dict[str, Any]]
    checkpoint: Optional[Checkpoint]
    error: Optional[BaseException]
    path: Optional[str]
    best_checkpoints: List[Tuple[Checkpoint, Dict[str, Any]]]
    filesystem: Any = dataclasses.field(repr=False)
    return_value: Optional[Any]
    _records: Optional[List[Dict[str, Any]]] = dataclasses.field(repr=False)
    _dataframe: Any = dataclasses.field(repr=False, compare=False)

    def __init__(self, metrics: Optional[Dict[str, Any]], checkpoint: Optional[Checkpoint],
                 error: Optional[BaseException], path: Optional[str], metrics_dataframe: Any = None,
                 best_checkpoints: Optional[List[Tuple[Checkpoint, Dict[str, Any]]]] = None,
                 _storage_filesystem: Any = None, return_value: Optional[Any] = None,
                 _records: Optional[List[Dict[str, Any]]] = None) -> None:
        self.metrics, self.checkpoint, self.error, self.path = metrics, checkpoint, error, path
        self.best_checkpoints = list(best_checkpoints or [])
        self.filesystem = _storage_filesystem
        self.return_value = return_value
        self._records = _records
        self._dataframe = metrics_dataframe

    @property
    def config(self) -> Optional[Dict[str, Any]]:
        """Ray Tune's trial config: refused, as Ray Train V2 does.

        Raises:
            NotSupportedError: naming the trainer's ``train_loop_config``.
        """
        raise not_supported("Result.config (a Ray Tune trial's config)", "the config the loop got is the trainer's "
                            "train_loop_config")

    @property
    def metrics_dataframe(self) -> Any:
        """Every metric rank 0 reported in the run (with or without a checkpoint), as a pandas
        DataFrame, one row per report, with a ``timestamp`` column; None in local mode (nothing is kept).

        Raises:
            ImportError: pandas is not installed (``pip install 'raytrain_nb[data]'``).
        """
        if self._dataframe is not None:
            return self._dataframe
        if self.path is None:
            return None
        try:
            import pandas as pd  # pandas: optional or heavy, loaded on first use
        except ImportError as exc:
            raise ImportError("Result.metrics_dataframe needs pandas: pip install pandas "
                              "(or pip install 'raytrain_nb[data]')") from exc
        records = self._records if self._records is not None else _read_records(self.path, self.filesystem)
        rows = [{**{k: v for k, v in r.items() if k != _TIME_KEY}, "timestamp": r.get(_TIME_KEY)} for r in records]
        return pd.DataFrame(rows)

    def get_best_checkpoint(self, metric: str, mode: str) -> Optional[Checkpoint]:
        """The committed checkpoint whose ``metric`` is highest (``mode="max"``) or lowest (``"min"``).

        Raises:
            ValueError: ``mode`` is not ``max`` or ``min``.
        """
        if mode not in ("max", "min"):
            raise ValueError(f"mode={mode!r} is unknown: use 'max' or 'min'")
        scored = [(c, m[metric]) for c, m in self.best_checkpoints
                  if isinstance(m.get(metric), (int, float)) and not isinstance(m.get(metric), bool)]
        if not scored:
            return None
        return (max if mode == "max" else min)(scored, key=lambda cm: cm[1])[0]

    @classmethod
    def from_path(cls, path: Any, storage_filesystem: Optional[Any] = None) -> "Result":
        """Read a run's result from its directory (no Ray needed).

        Raises:
            CheckpointError: the directory has neither a checkpoint index nor a metrics log.
        """

        fs, where = resolve(path, storage_filesystem)
        url = to_url(fs, where)
        records = _read_records(url, storage_filesystem)
        try:
            manager: Optional[CheckpointManager] = CheckpointManager.load(url, filesystem=storage_filesystem)
        except CheckpointError:
            if not records:
                raise CheckpointError(f"{url} is not a run directory: it has neither {'checkpoints.json'} nor "
                                      "metrics.jsonl") from None
            manager = None
        return cls.from_run(url, manager, records, None, fs)

    @classmethod
    def from_run(cls, url: str, manager: Any, records: List[Dict[str, Any]], error: Optional[BaseException],
                 filesystem: Any = None) -> "Result":
        """Build a result from a run's checkpoint manager and metric records."""
        latest = manager.latest("reported") if manager is not None else None
        best: List[Tuple[Checkpoint, Dict[str, Any]]] = []
        if manager is not None and manager.list("reported"):
            best = [(e.checkpoint, dict(e.metrics)) for e in manager.best(len(manager.list("reported")))]
        last = {k: v for k, v in records[-1].items() if k != _TIME_KEY} if records else None
        return cls(metrics=last, checkpoint=latest.checkpoint if latest is not None else None, error=error,
                   path=url, best_checkpoints=best, _storage_filesystem=filesystem, _records=records)


def _read_records(url: str, filesystem: Optional[Any]) -> List[Dict[str, Any]]:

    return read_metrics(url, filesystem)
