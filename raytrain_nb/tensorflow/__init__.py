"""TensorFlow on the worker group, mirroring ``ray.train.tensorflow`` (needs ``raytrain_nb[tensorflow]``).

Importing it sets ``TF_USE_LEGACY_KERAS=1`` in this process unless it is set: the workers train with the
legacy Keras 2 (``tf-keras``), and a checkpoint they saved loads here with the same Keras.
"""
from .._internal.frameworks.tensorflow_utils import TensorflowCheckpoint, prepare_dataset_shard
from .._internal.train.tensorflow import TensorflowConfig, TensorflowTrainer
from .._internal.train.trainer import install_autoinit

install_autoinit()  # Ray's implicit ray.init() in a script starts the quiet embedded instance

__all__ = ["TensorflowCheckpoint", "TensorflowConfig", "TensorflowTrainer", "prepare_dataset_shard"]
