"""``ScalingConfig``: how many workers a trainer runs, with which resources (Ray Train's, field for field).

Its arguments may be given by position in Ray Train's order (``trainer_resources`` first, as Ray Train V2 keeps it);
the resource properties (``num_cpus_per_worker``, ``total_resources``, ...) answer as Ray Train's do.

Example::

    ScalingConfig(num_workers=(2, 4), use_gpu=False)      # elastic: between 2 and 4 workers
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Tuple, Union

from ..validate import PLACEMENT_STRATEGIES, fail, is_int, is_number, not_supported, refuse

#: Ray's resource name that sends a worker to a node with this accelerator (and the tiny amount each asks for).
ACCELERATOR_PREFIX = "accelerator_type:"
ACCELERATOR_SHARE = 0.001


@dataclasses.dataclass
class ScalingConfig:
    """How many workers, with which resources (Ray Train's ``ScalingConfig``).

    Args:
        trainer_resources: accepted for compatibility; nothing is reserved (the driver process
            coordinates the run, there is no trainer actor). Ray Train V2 refuses it.
        num_workers: the number of workers (``0``: local mode, the function runs in the calling process), or
            ``(min, max)`` for elastic training: start with as
            many as fit (at most ``max``), continue with fewer (not below ``min``) when a worker is
            lost and its resources do not come back, and grow again when they do.
        use_gpu: one GPU per worker (unless ``resources_per_worker`` says otherwise); the torch
            backend becomes ``nccl``.
        resources_per_worker: e.g. ``{"CPU": 2, "GPU": 1, "custom": 1}``; default ``{"CPU": 1}``,
            or ``{"GPU": 1}`` with ``use_gpu``, as in Ray Train.
        placement_strategy: ``PACK`` (default), ``SPREAD``, ``STRICT_PACK`` or ``STRICT_SPREAD``.
        accelerator_type: e.g. ``"A100"``: workers go to nodes with that accelerator (with or without GPUs, as
            in Ray Train: each worker asks for a little of Ray's ``accelerator_type:A100`` resource).
        label_selector, use_tpu, topology: not supported (raise when set).
        elastic_resize_monitor_interval_s: only Ray Train's default (60) is accepted: an elastic run here
            checks for room to grow at its reports and grows at the next checkpoint.

    Raises:
        ConfigError: naming the field and the bad value (``NotSupportedError`` for what cannot be honoured).
    """

    trainer_resources: Optional[Dict[str, float]] = None
    num_workers: Union[int, Tuple[int, int]] = 1
    use_gpu: bool = False
    resources_per_worker: Optional[Dict[str, float]] = None
    placement_strategy: str = "PACK"
    accelerator_type: Optional[str] = None
    label_selector: Optional[Union[Dict[str, str], List[Dict[str, str]]]] = None
    use_tpu: bool = False
    topology: Optional[str] = None
    elastic_resize_monitor_interval_s: float = 60.0

    def __post_init__(self) -> None:
        n = self.num_workers
        if isinstance(n, list):
            n = self.num_workers = tuple(n)
        if isinstance(n, tuple):
            if len(n) != 2 or not all(is_int(v) for v in n):
                fail("ScalingConfig", "num_workers", n, "an elastic range is a (min, max) pair of whole numbers")
            if not 1 <= n[0] <= n[1]:
                fail("ScalingConfig", "num_workers", n, "an elastic range needs 1 <= min <= max")
        elif not is_int(n):
            fail("ScalingConfig", "num_workers", n, "pass a whole number of workers, or a (min, max) pair")
        elif n < 0:
            fail("ScalingConfig", "num_workers", n, "pass 1 or more workers, or 0 for local mode (the training "
                 "function runs in this process)")
        if not isinstance(self.use_gpu, bool):
            fail("ScalingConfig", "use_gpu", self.use_gpu, "pass True or False")
        self._check_resources()
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            fail("ScalingConfig", "placement_strategy", self.placement_strategy,
                 f"use one of {', '.join(PLACEMENT_STRATEGIES)}")
        if self.accelerator_type is not None and (not isinstance(self.accelerator_type, str)
                                                  or not self.accelerator_type):
            fail("ScalingConfig", "accelerator_type", self.accelerator_type, "pass a name such as 'A100'")
        if is_int(self.trainer_resources):
            fail("ScalingConfig", "trainer_resources", self.trainer_resources, "the first argument is "
                 f"trainer_resources, as in Ray Train: write ScalingConfig(num_workers={self.trainer_resources})")
        if self.trainer_resources is not None and not isinstance(self.trainer_resources, dict):
            fail("ScalingConfig", "trainer_resources", self.trainer_resources, "pass a dict or None")
        refuse("ScalingConfig", self, {"use_tpu": False, "topology": None}, "TPUs are not supported")
        refuse("ScalingConfig", self, {"label_selector": None}, "placing workers by node labels is not supported: "
               "give the nodes a custom resource and ask for it in resources_per_worker (e.g. {{'special': 1}}), or "
               "use accelerator_type")
        refuse("ScalingConfig", self, {"elastic_resize_monitor_interval_s": 60.0}, "an elastic run checks for room "
               "to grow at each report and grows at the next checkpoint: leave the default")

    def _check_resources(self) -> None:
        res = self.resources_per_worker
        if res is None:
            return
        if not isinstance(res, dict):
            fail("ScalingConfig", "resources_per_worker", res, "pass a dict such as {'CPU': 2, 'GPU': 1}")
        for key, value in res.items():
            if not isinstance(key, str) or not key:
                fail("ScalingConfig", "resources_per_worker", res, f"resource name {key!r} is not a string")
            if not is_number(value) or value < 0:
                fail("ScalingConfig", "resources_per_worker", res, f"{key!r} must be a number >= 0, not {value!r}")
        gpus = res.get("GPU", 0)
        if gpus and not self.use_gpu:
            fail("ScalingConfig", "resources_per_worker", res, "asks for GPUs but use_gpu=False: set use_gpu=True")
        if self.use_gpu and "GPU" in res and not gpus:
            fail("ScalingConfig", "resources_per_worker", res, "asks for 0 GPUs but use_gpu=True: set use_gpu=False "
                 "or ask for GPUs")
        if gpus > 1 and gpus != int(gpus):
            fail("ScalingConfig", "resources_per_worker", res, "a GPU count above 1 must be whole")

    # -- Ray Train's properties ---------------------------------------------------------------------------------

    @property
    def elasticity_enabled(self) -> bool:
        """Whether ``num_workers`` is a ``(min, max)`` range (Ray Train's test: a tuple, even ``(2, 2)``)."""
        return isinstance(self.num_workers, tuple)

    @property
    def elastic(self) -> bool:
        """Whether ``num_workers`` is a ``(min, max)`` range with ``min < max``."""
        return isinstance(self.num_workers, tuple) and self.num_workers[0] < self.num_workers[1]

    @property
    def min_workers(self) -> int:
        return self.num_workers[0] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def max_workers(self) -> int:
        return self.num_workers[1] if isinstance(self.num_workers, tuple) else self.num_workers

    @property
    def resources_per_worker_not_none(self) -> Dict[str, float]:
        """Each worker's resources as Ray Train computes them: the given ones without zeros (default one CPU, or one
        GPU with ``use_gpu``), one GPU added with ``use_gpu``, and a little of the accelerator type's resource."""
        if self.resources_per_worker is None:
            res: Dict[str, float] = {"GPU": 1} if self.use_gpu else {"CPU": 1}
        else:
            res = {k: v for k, v in self.resources_per_worker.items() if v != 0}
        if self.use_gpu:
            res.setdefault("GPU", 1)
        if self.accelerator_type:
            res.setdefault(ACCELERATOR_PREFIX + self.accelerator_type, ACCELERATOR_SHARE)
        return res

    @property
    def num_cpus_per_worker(self) -> float:
        """The CPUs each worker reserves."""
        return self.resources_per_worker_not_none.get("CPU", 0)

    @property
    def num_gpus_per_worker(self) -> float:
        """The GPUs each worker reserves."""
        return self.resources_per_worker_not_none.get("GPU", 0)

    @property
    def num_tpus_per_worker(self) -> float:
        """The TPUs each worker reserves (always 0: TPUs are not supported)."""
        return self.resources_per_worker_not_none.get("TPU", 0)

    @property
    def additional_resources_per_worker(self) -> Dict[str, float]:
        """Each worker's resources other than CPUs and GPUs (custom ones, the accelerator type's)."""
        return {k: v for k, v in self.resources_per_worker_not_none.items() if k not in ("CPU", "GPU")}

    @property
    def total_resources(self) -> Dict[str, float]:
        """What the run reserves in all: each worker's resources times ``max_workers`` (there is no trainer actor,
        as in Ray Train V2)."""
        return {k: v * self.max_workers for k, v in self.resources_per_worker_not_none.items()}

    def as_placement_group_factory(self) -> Any:
        """Ray Tune's resource request for a trainer run as a Tune trial: not supported.

        Raises:
            NotSupportedError: naming ``tune.with_resources``.
        """
        raise not_supported("ScalingConfig.as_placement_group_factory() (a trainer as a Tune trainable)",
                            "a Tune trial calls trainer.fit() in its function; give that function its own resources "
                            "with tune.with_resources(fn, {'cpu': 0.1})")

    @classmethod
    def from_placement_group_factory(cls, pgf: Any) -> "ScalingConfig":
        """Ray Tune's resource request turned back into a config: not supported.

        Raises:
            NotSupportedError: naming ``ScalingConfig(num_workers=..., resources_per_worker=...)``.
        """
        raise not_supported("ScalingConfig.from_placement_group_factory()",
                            "build ScalingConfig(num_workers=..., resources_per_worker=...) directly")

    def group_kwargs(self) -> Dict[str, Any]:
        """The per-worker arguments of :class:`~raytrain_nb.WorkerGroup` (without the count)."""
        res = self.resources_per_worker_not_none
        extra = {k: float(v) for k, v in res.items() if k not in ("CPU", "GPU")}
        return {"cpus_per_worker": res.get("CPU", 0), "gpus_per_worker": res.get("GPU", 0),
                "resources_per_worker": extra or None, "placement_strategy": self.placement_strategy}
