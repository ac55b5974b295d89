"""TensorFlow on a worker: ``TensorflowCheckpoint``, ``prepare_dataset_shard`` and the Keras report callback
(Ray Train's names and behaviour)."""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Optional, Union

from ..checkpoint.checkpoint import Checkpoint, FrameworkCheckpoint
from ..extras import require
from ..worker import session
from .tensorflow_backend import LEGACY_KERAS

os.environ.setdefault(LEGACY_KERAS, "1")  # before TensorFlow loads Keras: checkpoints load with the workers' Keras 2
tf = require("tensorflow")

MODEL_FILENAME_KEY = "_model_filename"
Metrics = Optional[Union[str, List[str], Dict[str, str]]]


def prepare_dataset_shard(tf_dataset_shard: Any) -> Any:
    """A ``tf.data.Dataset`` made from this worker's shard, with TensorFlow's auto-sharding off (the data is
    sharded already) and prefetching on (Ray Train's ``prepare_dataset_shard``)."""
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    return tf_dataset_shard.with_options(options).prefetch(tf.data.AUTOTUNE)


class TensorflowCheckpoint(FrameworkCheckpoint):
    """A :class:`~raytrain_nb.Checkpoint` holding a Keras model (Ray Train's ``TensorflowCheckpoint``)."""

    MODEL_FILENAME_KEY = MODEL_FILENAME_KEY

    @classmethod
    def from_model(cls, model: Any, *, preprocessor: Any = None) -> "TensorflowCheckpoint":
        """A checkpoint of ``model`` saved whole (``model.keras``)."""
        tmp = tempfile.mkdtemp()
        model.save(Path(tmp, "model.keras").as_posix())
        return cls._named(tmp, "model.keras", preprocessor)

    @classmethod
    def from_h5(cls, file_path: str, *, preprocessor: Any = None) -> "TensorflowCheckpoint":
        """A checkpoint of a model saved as ``.h5``."""
        if not os.path.isfile(file_path) or not file_path.endswith(".h5"):
            raise ValueError(f"TensorflowCheckpoint.from_h5({file_path!r}): not an .h5 file: pass the path "
                             "model.save('model.h5') wrote")
        tmp = tempfile.mkdtemp()
        shutil.copy(file_path, tmp)
        return cls._named(tmp, os.path.basename(file_path), preprocessor)

    @classmethod
    def from_saved_model(cls, dir_path: str, *, preprocessor: Any = None) -> "TensorflowCheckpoint":
        """A checkpoint of a SavedModel directory (the whole directory is the model)."""
        if not os.path.isdir(dir_path):
            raise ValueError(f"TensorflowCheckpoint.from_saved_model({dir_path!r}): not a directory: pass the "
                             "directory model.save(dir) wrote")
        tmp = os.path.join(tempfile.mkdtemp(), "saved_model")
        shutil.copytree(dir_path, tmp)
        return cls._named(tmp, ".", preprocessor)

    @classmethod
    def _named(cls, path: str, filename: str, preprocessor: Any) -> "TensorflowCheckpoint":
        if preprocessor is not None:
            raise ValueError(f"{cls.__name__}: preprocessor={preprocessor!r} is not supported (Ray Train deprecated "
                             "it): apply it to the dataset before training")
        checkpoint = cls.from_directory(path)
        checkpoint.update_metadata({MODEL_FILENAME_KEY: filename})
        return checkpoint

    def get_model(self) -> Any:
        """The Keras model stored in this checkpoint."""
        filename = self.get_metadata().get(MODEL_FILENAME_KEY)
        if filename is None:
            raise ValueError("this checkpoint has no Keras model: make it with TensorflowCheckpoint.from_model, "
                             "from_h5 or from_saved_model")
        with self.as_directory() as path:
            return tf.keras.models.load_model(os.path.join(path, filename))


class RayReportCallback(tf.keras.callbacks.Callback):
    """Reports Keras's logs and checkpoints the model (Ray Train's ``RayReportCallback``, the base of
    ``ReportCheckpointCallback``).

    Args:
        checkpoint_on: the Keras events (less ``on_``) after which to checkpoint; default ``"epoch_end"``.
        report_metrics_on: the events after which to report metrics; default ``"epoch_end"``.
        metrics: which logs to report: a name, a list, or ``{reported name: Keras's name}``; default all.

    Every rank saves the model (under ``MultiWorkerMirroredStrategy`` saving is collective); rank 0's
    copy is the reported checkpoint, committed once every rank reported.
    """

    EVENTS = ("epoch_begin", "epoch_end", "train_batch_begin", "train_batch_end", "test_batch_begin",
              "test_batch_end", "predict_batch_begin", "predict_batch_end", "train_begin", "train_end",
              "test_begin", "test_end", "predict_begin", "predict_end")

    def __init__(self, checkpoint_on: Union[str, List[str]] = "epoch_end",
                 report_metrics_on: Union[str, List[str]] = "epoch_end", metrics: Metrics = None) -> None:
        super().__init__()
        self._checkpoint_on = [checkpoint_on] if isinstance(checkpoint_on, str) else list(checkpoint_on)
        self._report_on = [report_metrics_on] if isinstance(report_metrics_on, str) else list(report_metrics_on)
        unknown = [e for e in self._checkpoint_on + self._report_on if e not in self.EVENTS]
        if unknown:
            raise ValueError(f"{type(self).__name__}: unknown Keras event(s) {unknown}: use one of "
                             f"{', '.join(self.EVENTS)}")
        self._metrics = metrics
        for event in set(self._checkpoint_on + self._report_on):
            setattr(self, f"on_{event}", self._handler(event))

    def _handler(self, event: str) -> Any:
        def handle(*args: Any, logs: Optional[Dict[str, Any]] = None) -> None:
            # Keras passes the logs by position: (epoch or batch, logs), or (logs) for train_begin and the like
            if logs is None and args and isinstance(args[-1], dict):
                logs = args[-1]
            self._handle(logs or {}, event)
        return handle

    def _reported(self, logs: Dict[str, Any]) -> Dict[str, Any]:
        pairs: Any
        if self._metrics is None:
            return {k: _plain(v) for k, v in logs.items()}
        if isinstance(self._metrics, str):
            pairs = [(self._metrics, self._metrics)]
        elif isinstance(self._metrics, dict):
            pairs = self._metrics.items()
        else:
            pairs = [(m, m) for m in self._metrics]
        missing = [m for _, m in pairs if m not in logs]
        if missing:
            raise KeyError(f"ReportCheckpointCallback: metric(s) {missing} are not in Keras's logs "
                           f"({', '.join(sorted(logs)) or 'none'}): name some of them")
        return {key: _plain(logs[m]) for key, m in pairs}

    def _handle(self, logs: Dict[str, Any], event: str) -> None:
        metrics = self._reported(logs)
        if event not in self._checkpoint_on:
            session.report(metrics)
            return
        checkpoint = TensorflowCheckpoint.from_model(self.model)  # every rank: saving is collective
        try:
            rank0 = session.get_context().get_world_rank() == 0
            session.report(metrics, checkpoint=checkpoint if rank0 else None)
        finally:
            shutil.rmtree(checkpoint.path, ignore_errors=True)


def _plain(value: Any) -> Any:
    """A Keras log value as a plain Python number where it is one."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


class ReportCheckpointCallback(RayReportCallback):
    """Ray Train's ``ReportCheckpointCallback``: :class:`RayReportCallback` as Ray Train's examples use it."""
