"""``BackendConfig`` and ``TorchConfig``: which collective a trainer's workers form, as Ray Train names them.

Both are dataclasses whose arguments may be given by position, as in Ray Train (``TorchConfig("gloo")``). The
framework configs (``XGBoostConfig``, ``LightGBMConfig``, ``TensorflowConfig``) derive from ``BackendConfig``.
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any, Callable, Dict, Optional

from ..validate import BACKENDS, fail, is_number, not_supported


@dataclasses.dataclass
class BackendConfig:
    """The framework backend of a :class:`~raytrain_nb.DataParallelTrainer`.

    Args:
        backend: ``"gloo"``, ``"nccl"`` or ``"none"`` (no process group); None picks
            per trainer (none for ``DataParallelTrainer``, gloo/nccl for ``TorchTrainer``).
    """

    backend: Optional[str] = None

    def __post_init__(self) -> None:
        if self.backend is not None and self.backend not in BACKENDS:
            fail(type(self).__name__, "backend", self.backend, f"use one of {', '.join(BACKENDS)}")

    @property
    def backend_cls(self) -> Any:
        """Ray Train's ``Backend`` class for this config (its hooks for a custom backend): not supported here.

        Raises:
            NotSupportedError: naming the configs that choose a backend.
        """
        raise not_supported(f"{type(self).__name__}.backend_cls (Ray Train's Backend hooks, for custom backends)",
                            "choose a backend with TorchConfig, XGBoostConfig, LightGBMConfig, TensorflowConfig or "
                            "DataParallelTrainer(backend='gloo'|'nccl'|'none')")

    @property
    def train_func_context(self) -> Callable[[], Any]:
        """What each worker runs the training function inside: nothing more here (the worker sets up its device
        and its collective before the function runs), so ``contextlib.nullcontext``."""
        return contextlib.nullcontext

    @property
    def framework(self) -> Optional[str]:
        """The framework's name (``"torch"``, ``"xgboost"``, ...); None for the framework-neutral config."""
        return None if type(self) is BackendConfig else self.backend

    def to_dict(self) -> Dict[str, Any]:
        """The config's fields, as a dict."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class TorchConfig(BackendConfig):
    """torch.distributed settings (Ray Train's ``TorchConfig``).

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default nccl with GPUs, gloo without.
        init_method: ``"env"`` or ``"tcp"``: both accepted, the rendezvous is the same.
        timeout_s: the process group's timeout in seconds: how long a collective waits for every rank.

    Raises:
        ConfigError: naming the field and the bad value.
    """

    init_method: str = "env"
    timeout_s: int = 1800

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.backend == "none":
            fail("TorchConfig", "backend", self.backend, "TorchTrainer needs gloo or nccl")
        if self.init_method not in ("env", "tcp"):
            fail("TorchConfig", "init_method", self.init_method, "use 'env' or 'tcp'")
        if not is_number(self.timeout_s) or self.timeout_s <= 0:
            fail("TorchConfig", "timeout_s", self.timeout_s, "pass a number of seconds > 0, e.g. 1800")

    @property
    def framework(self) -> Optional[str]:
        return "torch"
