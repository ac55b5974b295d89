"""Keras callbacks, mirroring ``ray.train.tensorflow.keras``."""
from .._internal.frameworks.tensorflow_utils import RayReportCallback, ReportCheckpointCallback, TensorflowCheckpoint

__all__ = ["RayReportCallback", "ReportCheckpointCallback", "TensorflowCheckpoint"]
