"""Validated, keyword-only configuration of a worker group."""
from __future__ import annotations

import dataclasses
from typing import Dict, Optional

from ..errors import GroupError
from ..validate import BACKENDS, PLACEMENT_STRATEGIES, check_number  # noqa: F401 - BACKENDS re-exported
from .kinds import GroupKind, backend_names, kind_for


@dataclasses.dataclass(frozen=True)
class GroupConfig:
    """Shape of a :class:`~raytrain_nb.WorkerGroup`, checked on construction.

    Raises:
        GroupError: naming the field, the value and the fix.
    """

    num_workers: int = 2
    cpus_per_worker: float = 1
    gpus_per_worker: float = 0
    resources_per_worker: Optional[Dict[str, float]] = None
    placement_strategy: str = "PACK"
    backend: Optional[str] = None

    def __post_init__(self) -> None:
        n = self.num_workers
        if isinstance(n, bool) or not isinstance(n, int):
            raise GroupError(f"num_workers={n!r} is not a whole number: pass e.g. --workers 2")
        if n < 1:
            raise GroupError(f"num_workers={n} is not allowed: a group needs at least 1 worker (--workers 1)")
        check_number("cpus_per_worker", self.cpus_per_worker, "--cpus", allow_zero=True)
        check_number("gpus_per_worker", self.gpus_per_worker, "--gpus", allow_zero=True)
        if self.gpus_per_worker > 1 and self.gpus_per_worker != int(self.gpus_per_worker):
            raise GroupError(f"gpus_per_worker={self.gpus_per_worker} is not allowed: use a fraction "
                             "below 1 or a whole number")
        for key, value in (self.resources_per_worker or {}).items():
            if key in ("CPU", "GPU"):
                raise GroupError(f"resources_per_worker[{key!r}] is not allowed: use "
                                 f"{'cpus' if key == 'CPU' else 'gpus'}_per_worker")
            check_number(f"resources_per_worker[{key!r}]", value, "resources_per_worker", allow_zero=True)
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            raise GroupError(f"placement_strategy={self.placement_strategy!r} is unknown: use one of "
                             f"{', '.join(PLACEMENT_STRATEGIES)}")
        if self.backend is not None and self.backend not in backend_names():
            raise GroupError(f"backend={self.backend!r} is unknown: use one of {', '.join(backend_names())}")
        if self.backend is not None and self.kind.needs_gpus and not self.gpus_per_worker:
            raise GroupError("backend='nccl' needs GPUs: add --gpus 1, or use --backend gloo on CPUs")

    @property
    def kind(self) -> GroupKind:
        """The kind of group this config asks for (``group/kinds.py``); a group takes it once, when made."""
        return kind_for(self.backend, self.gpus_per_worker)

    @property
    def resolved_backend(self) -> str:
        """The torch backend used: ``nccl`` with GPUs, ``gloo`` otherwise, unless set (``none`` for a framework's
        own collective: XGBoost, LightGBM...)."""
        return self.kind.torch_backend

    @property
    def framework(self) -> Optional[str]:
        """The framework backend (``xgboost``, ``lightgbm``...; ``worker/framework.py``), or None for torch."""
        framework = self.kind.framework
        return framework.name if framework is not None else None

    def bundle(self) -> Dict[str, float]:
        """Resources of one worker's placement-group bundle."""
        out: Dict[str, float] = {"CPU": float(self.cpus_per_worker)}
        if self.gpus_per_worker:
            out["GPU"] = float(self.gpus_per_worker)
        out.update({k: float(v) for k, v in (self.resources_per_worker or {}).items()})
        return {k: v for k, v in out.items() if v}

    def placement_bundle(self) -> Dict[str, float]:
        """:meth:`bundle`, or a token of memory for a worker that reserves nothing (Ray needs a non-empty
        bundle, and a token CPU would keep the last whole CPU from Ray Data's tasks)."""
        return self.bundle() or {"memory": float(1 << 20)}
