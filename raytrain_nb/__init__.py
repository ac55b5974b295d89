"""raytrain_nb: interactive, fault-tolerant distributed training from a Jupyter notebook.

The worker-side API mirrors ``ray.train`` (``report``, ``get_context``,
``get_checkpoint``, ``get_dataset_shard``); ``raytrain_nb.torch`` mirrors
``ray.train.torch``. ``import raytrain_nb`` imports neither torch nor Ray:
the heavier parts load on first use.

In a notebook::

    %load_ext raytrain_nb
"""
from __future__ import annotations

import importlib
from typing import Any

from ._internal import frontend as _frontend
from ._internal.frameworks import boosting as _boosting
from ._internal.frameworks import tensorflow_backend as _tensorflow_backend
from ._internal.worker import framework as _framework
from ._internal.worker.session import (TRAIN_DATASET_KEY, TrainContext, get_checkpoint, get_context,
                                      get_dataset_shard, report)
from .notebook.frontend import FRONTEND as _NOTEBOOK_FRONTEND

# The core shows dashboards through a hook; the notebook layer is what fills it.
_frontend.register(_NOTEBOOK_FRONTEND)
# WorkerGroup(backend="xgboost" | "lightgbm" | "tensorflow"): framework backends the group wraps every cell in.
for _backend in (_boosting.XGBOOST, _boosting.LIGHTGBM, _tensorflow_backend.TENSORFLOW):
    _framework.register(_backend)

__version__ = "0.1.0"

_LAZY = {
    "WorkerGroup": ("._internal.group.group", "WorkerGroup"),
    "active_group": ("._internal.group.group", "active_group"),
    "GroupState": ("._internal.group.state", "GroupState"),
    "WorkerStatus": ("._internal.group.types", "WorkerStatus"),
    "CellResult": ("._internal.group.types", "CellResult"),
    "OutputSink": ("._internal.output", "OutputSink"),
    "RaytrainNbError": ("._internal.errors", "RaytrainNbError"),
    "GroupError": ("._internal.errors", "GroupError"),
    "ResourceError": ("._internal.errors", "ResourceError"),
    "RecoveryError": ("._internal.errors", "RecoveryError"),
    "WorkerError": ("._internal.errors", "WorkerError"),
    "WorkerLostError": ("._internal.errors", "WorkerLostError"),
    "WorkerDiedError": ("._internal.errors", "WorkerDiedError"),
    "WorkerUnresponsiveError": ("._internal.errors", "WorkerUnresponsiveError"),
    "StorageError": ("._internal.errors", "StorageError"),
    "CheckpointError": ("._internal.errors", "CheckpointError"),
    "Checkpoint": ("._internal.checkpoint.checkpoint", "Checkpoint"),
    "CheckpointManager": ("._internal.checkpoint.manager", "CheckpointManager"),
    # script mode (Ray Train's names)
    "ScalingConfig": ("._internal.train.config", "ScalingConfig"),
    "RunConfig": ("._internal.train.config", "RunConfig"),
    "FailureConfig": ("._internal.train.config", "FailureConfig"),
    "CheckpointConfig": ("._internal.train.config", "CheckpointConfig"),
    "DataConfig": ("._internal.train.config", "DataConfig"),
    "BackendConfig": ("._internal.train.config", "BackendConfig"),
    "ConfigError": ("._internal.errors", "ConfigError"),
    "DataParallelTrainer": ("._internal.train.trainer", "DataParallelTrainer"),
    "Result": ("._internal.train.result", "Result"),
    "TrainingFailedError": ("._internal.train.failures", "TrainingFailedError"),
    "WorkerGroupError": ("._internal.train.failures", "WorkerGroupError"),
    "ControllerError": ("._internal.train.failures", "ControllerError"),
    "NCCLHangError": ("._internal.train.failures", "NCCLHangError"),
    "PreemptionError": ("._internal.train.failures", "PreemptionError"),
    "LoggingConfig": ("._internal.train.config", "LoggingConfig"),
    "SyncConfig": ("._internal.train.config", "SyncConfig"),
    "NotSupportedError": ("._internal.errors", "NotSupportedError"),
    # Ray Train V2's report() options, reported checkpoints, validation and preemption notices
    "CheckpointUploadMode": ("._internal.worker.report_api", "CheckpointUploadMode"),
    "CheckpointConsistencyMode": ("._internal.worker.report_api", "CheckpointConsistencyMode"),
    "ReportedCheckpoint": ("._internal.worker.report_api", "ReportedCheckpoint"),
    "ReportedCheckpointStatus": ("._internal.worker.report_api", "ReportedCheckpointStatus"),
    "ValidationConfig": ("._internal.worker.report_api", "ValidationConfig"),
    "ValidationFn": ("._internal.worker.report_api", "ValidationFn"),
    "ValidationTaskConfig": ("._internal.worker.report_api", "ValidationTaskConfig"),
    "PreemptionInfo": ("._internal.worker.report_api", "PreemptionInfo"),
    "get_all_reported_checkpoints": ("._internal.worker.session", "get_all_reported_checkpoints"),
    "get_preemption_info": ("._internal.worker.report_api", "get_preemption_info"),
    "UserCallback": ("._internal.train.callbacks", "UserCallback"),
    "TrainRunContext": ("._internal.train.callbacks", "TrainRunContext"),
    "JsonLoggerCallback": ("._internal.train.callbacks", "JsonLoggerCallback"),
    "CSVLoggerCallback": ("._internal.train.callbacks", "CSVLoggerCallback"),
    "TensorBoardCallback": ("._internal.train.callbacks", "TensorBoardCallback"),
    "TBXLoggerCallback": ("._internal.train.callbacks", "TBXLoggerCallback"),
}

__all__ = ["TRAIN_DATASET_KEY", "TrainContext", "get_checkpoint", "get_context", "get_dataset_shard", "report",
           "load_ipython_extension", "unload_ipython_extension", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:  # import raytrain_nb stays light: Ray and torch load with the names that need them

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module, __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raytrain_nb' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext raytrain_nb``: register the magics."""
    from .notebook.extension import load_ipython_extension as load  # IPython: only inside a kernel

    load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    """``%unload_ext raytrain_nb``."""
    from .notebook.extension import unload_ipython_extension as unload  # IPython: only inside a kernel

    unload(ipython)
