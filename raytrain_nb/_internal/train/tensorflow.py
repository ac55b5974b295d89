"""``TensorflowTrainer`` and ``TensorflowConfig``: Ray Train's TensorFlow trainer on the worker group.

The group runs the ``tensorflow`` framework backend (``frameworks/tensorflow_backend.py``): every rank gets
``TF_CONFIG`` for ``tf.distribute.MultiWorkerMirroredStrategy`` (and the legacy Keras 2) before the training
function runs. TensorFlow cannot form its collective again inside a live process, so every failure starts
fresh processes for every rank, and the function resumes from ``get_checkpoint()``.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional

from ..validate import fail
from .config import BackendConfig, DataConfig, RunConfig, ScalingConfig
from .trainer import DataParallelTrainer



@dataclasses.dataclass
class TensorflowConfig(BackendConfig):
    """TensorFlow's distributed setup (Ray Train's ``TensorflowConfig``): ``TF_CONFIG`` on every rank."""

    backend: Optional[str] = dataclasses.field(default="tensorflow", init=False)

    def __post_init__(self) -> None:
        if self.backend not in (None, "tensorflow"):
            fail("TensorflowConfig", "backend", self.backend, "TensorflowConfig's backend is 'tensorflow'")
        self.backend = "tensorflow"

    def to_dict(self) -> Dict[str, Any]:
        return {}


class TensorflowTrainer(DataParallelTrainer):
    """Ray Train's ``TensorflowTrainer``: ``train_loop_per_worker`` runs on every worker with ``TF_CONFIG`` set,
    so a ``tf.distribute.MultiWorkerMirroredStrategy`` created in it spans every worker.

    Args:
        tensorflow_config: a :class:`TensorflowConfig`.
        Others: as :class:`~raytrain_nb.DataParallelTrainer`.

    Example::

        trainer = TensorflowTrainer(train_loop_per_worker, scaling_config=ScalingConfig(num_workers=2),
                                    datasets={"train": train_dataset}, train_loop_config={"num_epochs": 2})
        result = trainer.fit()
    """

    _default_backend = "tensorflow"
    _backend_config_cls = TensorflowConfig

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, train_loop_config: Optional[Dict[str, Any]] = None,
                 tensorflow_config: Optional[TensorflowConfig] = None, scaling_config: Optional[ScalingConfig] = None,
                 dataset_config: Optional[DataConfig] = None, run_config: Optional[RunConfig] = None,
                 datasets: Optional[Dict[str, Any]] = None, validation_config: Optional[Any] = None,
                 metadata: Optional[Dict[str, Any]] = None, resume_from_checkpoint: Optional[Any] = None) -> None:
        if tensorflow_config is not None and not isinstance(tensorflow_config, TensorflowConfig):
            fail("TensorflowTrainer", "tensorflow_config", tensorflow_config, "pass a raytrain_nb.tensorflow."
                 "TensorflowConfig")
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         backend_config=tensorflow_config or TensorflowConfig(), scaling_config=scaling_config,
                         run_config=run_config, datasets=datasets, dataset_config=dataset_config,
                         resume_from_checkpoint=resume_from_checkpoint, metadata=metadata,
                         validation_config=validation_config)
