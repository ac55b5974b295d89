"""Ray Train's configuration classes, validated on construction.

``ScalingConfig``, ``RunConfig``, ``FailureConfig``, ``CheckpointConfig``, ``DataConfig``,
``TorchConfig`` and ``BackendConfig`` take Ray Train's arguments, so a ported script builds them
unchanged. Every field is checked in ``__post_init__``; a bad value raises :class:`ConfigError`
(a ``ValueError``) in one line naming the class, the field and the value. Arguments Ray Train has
but this project cannot honour raise too, naming them, instead of being ignored.

Example::

    ScalingConfig(num_workers=(2, 4), use_gpu=False)      # elastic: between 2 and 4 workers
    RunConfig(name="mnist", storage_path="s3://bucket/runs",
              failure_config=FailureConfig(max_failures=3))
"""
from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..checkpoint.storage import as_fsspec
from ..errors import StorageError
from ..validate import BACKENDS, PLACEMENT_STRATEGIES, fail, is_int, is_number, refuse

_KW = {"kw_only": True} if sys.version_info >= (3, 10) else {}




@dataclasses.dataclass(**_KW)
class ScalingConfig:
    """How many workers, with which resources (Ray Train's ``ScalingConfig``).

    Args:
        num_workers: the number of workers (``0``: local mode, the function runs in the calling process), or
            ``(min, max)`` for elastic training: start with as
            many as fit (at most ``max``), continue with fewer (not below ``min``) when a worker is
            lost and its resources do not come back, and grow again when they do.
        use_gpu: one GPU per worker (unless ``resources_per_worker`` says otherwise); the torch
            backend becomes ``nccl``.
        resources_per_worker: e.g. ``{"CPU": 2, "GPU": 1, "custom": 1}``; default ``{"CPU": 1}``,
            or ``{"GPU": 1}`` with ``use_gpu``, as in Ray Train.
        placement_strategy: ``PACK`` (default), ``SPREAD``, ``STRICT_PACK`` or ``STRICT_SPREAD``.
        accelerator_type: e.g. ``"A100"``: workers go to nodes with that accelerator.
        trainer_resources: accepted for compatibility; nothing is reserved (the driver process
            coordinates the run, there is no trainer actor).
        use_tpu, topology: not supported (raise when set).

    Raises:
        ConfigError: naming the field and the bad value.
    """

    num_workers: Union[int, Tuple[int, int]] = 1
    use_gpu: bool = False
    resources_per_worker: Optional[Dict[str, float]] = None
    placement_strategy: str = "PACK"
    accelerator_type: Optional[str] = None
    trainer_resources: Optional[Dict[str, float]] = None
    use_tpu: bool = False
    topology: Optional[str] = None

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
        res = self.resources_per_worker
        if res is not None:
            if not isinstance(res, dict):
                fail("ScalingConfig", "resources_per_worker", res, "pass a dict such as {'CPU': 2, 'GPU': 1}")
            for key, value in res.items():
                if not isinstance(key, str) or not key:
                    fail("ScalingConfig", "resources_per_worker", res, f"resource name {key!r} is not a string")
                if not is_number(value) or value < 0:
                    fail("ScalingConfig", "resources_per_worker", res,
                          f"{key!r} must be a number >= 0, not {value!r}")
            gpus = res.get("GPU", 0)
            if gpus and not self.use_gpu:
                fail("ScalingConfig", "resources_per_worker", res, "asks for GPUs but use_gpu=False: "
                      "set use_gpu=True")
            if gpus > 1 and gpus != int(gpus):
                fail("ScalingConfig", "resources_per_worker", res, "a GPU count above 1 must be whole")
        if self.placement_strategy not in PLACEMENT_STRATEGIES:
            fail("ScalingConfig", "placement_strategy", self.placement_strategy,
                  f"use one of {', '.join(PLACEMENT_STRATEGIES)}")
        if self.accelerator_type is not None and (not isinstance(self.accelerator_type, str)
                                                  or not self.accelerator_type):
            fail("ScalingConfig", "accelerator_type", self.accelerator_type, "pass a name such as 'A100'")
        if self.accelerator_type is not None and not self.use_gpu:
            fail("ScalingConfig", "accelerator_type", self.accelerator_type, "needs use_gpu=True")
        if self.trainer_resources is not None and not isinstance(self.trainer_resources, dict):
            fail("ScalingConfig", "trainer_resources", self.trainer_resources, "pass a dict or None")
        refuse("ScalingConfig", self, {"use_tpu": False, "topology": None}, "TPUs are not supported")

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

    def _resources(self) -> Dict[str, float]:
        if self.resources_per_worker is not None:
            return dict(self.resources_per_worker)
        return {"GPU": 1.0} if self.use_gpu else {"CPU": 1.0}

    def group_kwargs(self) -> Dict[str, Any]:
        """The per-worker arguments of :class:`~raytrain_nb.WorkerGroup` (without the count)."""
        res = self._resources()
        extra = {k: float(v) for k, v in res.items() if k not in ("CPU", "GPU")}
        if self.accelerator_type:
            extra[f"accelerator_type:{self.accelerator_type}"] = 0.001
        return {"cpus_per_worker": res.get("CPU", 0), "gpus_per_worker": res.get("GPU", 0),
                "resources_per_worker": extra or None, "placement_strategy": self.placement_strategy}


@dataclasses.dataclass(**_KW)
class FailureConfig:
    """How often a failed run is restarted (Ray Train's ``FailureConfig``).

    Args:
        max_failures: restarts allowed after a worker dies or raises: ``0`` (default) fails
            at once, ``-1`` restarts without limit.
        fail_fast: Ray Tune's option; only ``False`` is accepted.

    Raises:
        ConfigError: naming the field and the bad value.
    """

    max_failures: int = 0
    fail_fast: Union[bool, str] = False

    def __post_init__(self) -> None:
        if not is_int(self.max_failures) or self.max_failures < -1:
            fail("FailureConfig", "max_failures", self.max_failures,
                  "pass a whole number >= 0, or -1 for no limit")
        refuse("FailureConfig", self, {"fail_fast": False}, "{field} is a Ray Tune option; use max_failures=0")


@dataclasses.dataclass(**_KW)
class CheckpointConfig:
    """Which reported checkpoints to keep (Ray Train's ``CheckpointConfig``).

    Args:
        num_to_keep: how many to keep (None: all); the newest is never deleted.
        checkpoint_score_attribute: the reported metric that ranks them (None: by recency).
        checkpoint_score_order: ``"max"`` (default) or ``"min"``.
        checkpoint_frequency, checkpoint_at_end: Ray Tune options; not supported (raise when set).

    Raises:
        ConfigError: naming the field and the bad value.
    """

    num_to_keep: Optional[int] = None
    checkpoint_score_attribute: Optional[str] = None
    checkpoint_score_order: str = "max"
    checkpoint_frequency: int = 0
    checkpoint_at_end: Optional[bool] = None

    def __post_init__(self) -> None:
        if self.num_to_keep is not None and (not is_int(self.num_to_keep) or self.num_to_keep < 1):
            fail("CheckpointConfig", "num_to_keep", self.num_to_keep, "pass None to keep all, or a whole number >= 1")
        attr = self.checkpoint_score_attribute
        if attr is not None and (not isinstance(attr, str) or not attr):
            fail("CheckpointConfig", "checkpoint_score_attribute", attr, "pass a reported metric's name, e.g. 'loss'")
        if self.checkpoint_score_order not in ("max", "min"):
            fail("CheckpointConfig", "checkpoint_score_order", self.checkpoint_score_order, "use 'max' or 'min'")
        refuse("CheckpointConfig", self, {"checkpoint_frequency": 0, "checkpoint_at_end": None},
                "{field} is a Ray Tune option: report a checkpoint from the training loop instead")


@dataclasses.dataclass(**_KW)
class RunConfig:
    """Where the run is kept and how it behaves (Ray Train's ``RunConfig``).

    Args:
        name: the run's name; a trainer created again with the same ``name`` and
            ``storage_path`` resumes from that run's newest checkpoint. Default:
            ``<TrainerClass>_<date>_<time>``.
        storage_path: where runs are kept: a local path or an fsspec URL (``s3://``, ``gs://``)
            every worker can reach. Default ``RAYTRAIN_NB_STORAGE_PATH`` or ``~/raytrain_nb_results``.
        storage_filesystem: a ``pyarrow.fs.FileSystem`` or fsspec filesystem for ``storage_path``.
            Workers rebuild it from its URL, so it must be the local disk or need no options
            beyond the environment (e.g. ``AWS_ENDPOINT_URL``); otherwise it is refused.
        failure_config: restarts after failures (default: none).
        checkpoint_config: which checkpoints to keep (default: all).
        callbacks: objects with ``after_report(metrics, checkpoint)`` and/or
            ``after_exception(errors)`` (see :mod:`raytrain_nb._internal.callbacks`).
        verbose: ``0`` hides the progress line; ``None``/``1``/``2`` show it.
        stop, sync_config, progress_reporter, worker_runtime_env, log_to_file: Ray Tune/Train
            options that are not supported (raise when set).

    Raises:
        ConfigError: naming the field and the bad value.
    """

    name: Optional[str] = None
    storage_path: Optional[str] = None
    storage_filesystem: Optional[Any] = None
    failure_config: Optional[FailureConfig] = None
    checkpoint_config: Optional[CheckpointConfig] = None
    callbacks: Optional[List[Any]] = None
    verbose: Optional[int] = None
    stop: Optional[Any] = None
    sync_config: Optional[Any] = None
    progress_reporter: Optional[Any] = None
    worker_runtime_env: Optional[Dict[str, Any]] = None
    log_to_file: Union[bool, str] = False

    def __post_init__(self) -> None:
        if self.name is not None and (not isinstance(self.name, str) or not self.name.strip()
                                      or "/" in self.name or self.name in (".", "..")):
            fail("RunConfig", "name", self.name, "pass a non-empty name without '/'")
        if self.storage_path is not None:
            try:
                self.storage_path = os.fspath(self.storage_path)
            except TypeError:
                pass
            if not isinstance(self.storage_path, str) or not self.storage_path.strip():
                fail("RunConfig", "storage_path", self.storage_path, "pass a local path or a URL such as s3://bucket/runs")
        if self.failure_config is not None and not isinstance(self.failure_config, FailureConfig):
            fail("RunConfig", "failure_config", self.failure_config, "pass a raytrain_nb.FailureConfig")
        if self.checkpoint_config is not None and not isinstance(self.checkpoint_config, CheckpointConfig):
            fail("RunConfig", "checkpoint_config", self.checkpoint_config, "pass a raytrain_nb.CheckpointConfig")
        if self.callbacks is not None:
            if not isinstance(self.callbacks, (list, tuple)):
                fail("RunConfig", "callbacks", self.callbacks, "pass a list of callback objects")
            for cb in self.callbacks:
                if not any(callable(getattr(cb, h, None)) for h in ("after_report", "after_exception")):
                    fail("RunConfig", "callbacks", cb, "a callback needs an after_report or after_exception method "
                          "(Ray Tune callbacks such as on_trial_result are not supported)")
        if self.verbose is not None and self.verbose not in (0, 1, 2, 3):
            fail("RunConfig", "verbose", self.verbose, "use 0 (no progress line), 1 or 2")
        if self.storage_filesystem is not None:

            try:
                as_fsspec(self.storage_filesystem)
            except StorageError:
                fail("RunConfig", "storage_filesystem", self.storage_filesystem,
                      "pass a pyarrow.fs.FileSystem or an fsspec filesystem")
        refuse("RunConfig", self, {"stop": None, "sync_config": None, "progress_reporter": None,
                                    "worker_runtime_env": None, "log_to_file": False},
                "{field} is not supported")

    @property
    def max_failures(self) -> int:
        return (self.failure_config or FailureConfig()).max_failures


@dataclasses.dataclass(**_KW)
class DataConfig:
    """Which datasets are split across workers (Ray Train's ``DataConfig``).

    Args:
        datasets_to_split: ``"all"`` (default) or a list of dataset names; the others are
            given whole to every worker.
        execution_options: not supported (raise when set).

    Raises:
        ConfigError: naming the field and the bad value.
    """

    datasets_to_split: Union[str, Sequence[str]] = "all"
    execution_options: Optional[Any] = None

    def __post_init__(self) -> None:
        d = self.datasets_to_split
        if d != "all" and (isinstance(d, str) or not isinstance(d, (list, tuple))
                           or not all(isinstance(n, str) for n in d)):
            fail("DataConfig", "datasets_to_split", d, "pass 'all' or a list of dataset names")
        refuse("DataConfig", self, {"execution_options": None}, "{field} is not supported")

    def splits(self, name: str) -> bool:
        return self.datasets_to_split == "all" or name in self.datasets_to_split


@dataclasses.dataclass(**_KW)
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


@dataclasses.dataclass(**_KW)
class TorchConfig(BackendConfig):
    """torch.distributed settings (Ray Train's ``TorchConfig``).

    Args:
        backend: ``"gloo"`` or ``"nccl"``; default nccl with GPUs, gloo without.
        init_method: ``"env"`` or ``"tcp"``: both accepted, the rendezvous is the same.
        timeout_s: the process group timeout; only the default 1800 is supported.

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
        if self.timeout_s != 1800:
            fail("TorchConfig", "timeout_s", self.timeout_s, "cannot be honoured: the process group "
                  "timeout is fixed at 1800 s")
