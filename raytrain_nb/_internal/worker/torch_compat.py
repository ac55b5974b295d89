"""Small ``ray.train.torch`` helpers kept so ported scripts run unchanged (worker side)."""
from __future__ import annotations

import os
import random
from typing import Any, List

import torch

from ..validate import not_supported
from .torch_utils import get_device


def get_devices() -> List[torch.device]:
    """The devices of this worker (one: see :func:`get_device`)."""
    return [get_device()]


def accelerate(amp: bool = False) -> None:
    """Ray Train's switch for automatic mixed precision: ``amp=False`` does nothing; AMP itself is not supported.

    Raises:
        NotSupportedError: ``amp=True``, naming ``torch.autocast``.
    """
    if amp:
        raise not_supported("accelerate(amp=True) (mixed precision through Ray Train)", "use torch.autocast and "
                            "torch.amp.GradScaler in the training loop")


def prepare_optimizer(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """Ray Train wraps the optimizer for its AMP support; here it is returned unchanged."""
    return optimizer


def backward(tensor: torch.Tensor) -> None:
    """``tensor.backward()`` (Ray Train's AMP-aware helper; no AMP scaling here)."""
    tensor.backward()


def enable_reproducibility(seed: int = 0) -> None:
    """Seed Python, NumPy and torch and ask torch for deterministic algorithms, as Ray Train does.

    Example:
        >>> enable_reproducibility(seed=42)  # doctest: +SKIP
    """
    torch.manual_seed(seed)
    random.seed(seed)
    try:
        import numpy as np  # numpy: optional or heavy, loaded on first use

        np.random.seed(seed)
    except ImportError:  # pragma: no cover
        pass
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


__all__: List[Any] = ["accelerate", "backward", "enable_reproducibility", "get_devices", "prepare_optimizer"]
