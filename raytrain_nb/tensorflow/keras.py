"""Keras callbacks, mirroring ``ray.train.tensorflow.keras``."""
from .._internal.frameworks.tensorflow_utils import ReportCheckpointCallback

__all__ = ["ReportCheckpointCallback"]
