"""PyTorch helpers and the trainer, mirroring ``ray.train.torch``."""
from ._internal.frameworks.torch_checkpoint import TorchCheckpoint
from ._internal.train.config import TorchConfig
from ._internal.train.trainer import TorchTrainer, install_autoinit
from ._internal.worker.torch_compat import (accelerate, backward, enable_reproducibility, get_devices,
                                           prepare_optimizer)
from ._internal.worker.torch_utils import get_device, prepare_data_loader, prepare_model

install_autoinit()  # Ray's implicit ray.init() in a script starts the quiet embedded instance

__all__ = ["TorchCheckpoint", "TorchConfig", "TorchTrainer", "accelerate", "backward", "enable_reproducibility",
           "get_device", "get_devices", "prepare_data_loader", "prepare_model", "prepare_optimizer"]
