"""PyTorch helpers, mirroring ``ray.train.torch``."""
from ._internal.torch_utils import get_device, prepare_data_loader, prepare_model

__all__ = ["get_device", "prepare_data_loader", "prepare_model"]
