"""raytrain_nb: interactive, fault-tolerant distributed training from a Jupyter notebook.

The worker-side API mirrors ``ray.train`` (``report``, ``get_context``,
``get_checkpoint``, ``get_dataset_shard``); ``raytrain_nb.torch`` mirrors
``ray.train.torch``. ``import raytrain_nb`` imports neither torch nor Ray:
the heavier parts load on first use.

In a notebook::

    %load_ext raytrain_nb
"""
from __future__ import annotations

from typing import Any

from ._internal.session import TrainContext, get_checkpoint, get_context, get_dataset_shard, report

__version__ = "0.1.0"

_LAZY = {
    "WorkerGroup": ("._internal.group", "WorkerGroup"),
    "active_group": ("._internal.group", "active_group"),
    "GroupState": ("._internal.group", "GroupState"),
    "WorkerStatus": ("._internal.group", "WorkerStatus"),
    "CellResult": ("._internal.group", "CellResult"),
    "OutputSink": ("._internal.output", "OutputSink"),
    "RaytrainNbError": ("._internal.errors", "RaytrainNbError"),
    "GroupError": ("._internal.errors", "GroupError"),
    "ResourceError": ("._internal.errors", "ResourceError"),
    "WorkerError": ("._internal.errors", "WorkerError"),
    "StorageError": ("._internal.errors", "StorageError"),
    "CheckpointError": ("._internal.errors", "CheckpointError"),
    "Checkpoint": ("._internal.checkpoint", "Checkpoint"),
    "CheckpointManager": ("._internal.checkpoint_manager", "CheckpointManager"),
    # script mode (Ray Train's names)
    "ScalingConfig": ("._internal.train_config", "ScalingConfig"),
    "RunConfig": ("._internal.train_config", "RunConfig"),
    "FailureConfig": ("._internal.train_config", "FailureConfig"),
    "CheckpointConfig": ("._internal.train_config", "CheckpointConfig"),
    "DataConfig": ("._internal.train_config", "DataConfig"),
    "BackendConfig": ("._internal.train_config", "BackendConfig"),
    "ConfigError": ("._internal.train_config", "ConfigError"),
    "DataParallelTrainer": ("._internal.trainer", "DataParallelTrainer"),
    "Result": ("._internal.result", "Result"),
    "TrainingFailedError": ("._internal.result", "TrainingFailedError"),
    "UserCallback": ("._internal.callbacks", "UserCallback"),
    "TrainRunContext": ("._internal.callbacks", "TrainRunContext"),
    "JsonLoggerCallback": ("._internal.callbacks", "JsonLoggerCallback"),
    "CSVLoggerCallback": ("._internal.callbacks", "CSVLoggerCallback"),
    "TensorBoardCallback": ("._internal.callbacks", "TensorBoardCallback"),
    "TBXLoggerCallback": ("._internal.callbacks", "TBXLoggerCallback"),
}

__all__ = ["TrainContext", "get_checkpoint", "get_context", "get_dataset_shard", "report",
           "load_ipython_extension", "unload_ipython_extension", *_LAZY]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module, __name__), attr)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'raytrain_nb' has no attribute {name!r}")


def load_ipython_extension(ipython: Any) -> None:
    """``%load_ext raytrain_nb``: register the magics."""
    from .notebook.magics import load_ipython_extension as _load

    _load(ipython)


def unload_ipython_extension(ipython: Any) -> None:
    from .notebook.magics import unload_ipython_extension as _unload

    _unload(ipython)
