"""``DataParallelTrainer`` and ``TorchTrainer``: Ray Train's trainers on the notebook's worker group.

One core, two front ends: ``fit()`` starts a :class:`~raytrain_nb.WorkerGroup` and runs the
training function on every rank with ``group.execute`` (the same actors, ``report`` and
checkpoints as a ``%%distributed`` cell). Failures are handled by :mod:`.elastic`, the run by
:mod:`.fit_run`.

Example::

    from raytrain_nb import ScalingConfig, RunConfig
    from raytrain_nb.torch import TorchTrainer

    def train_func(config):
        ...
        raytrain_nb.report({"loss": loss}, checkpoint=Checkpoint.from_directory(tmp))

    result = TorchTrainer(train_func, train_loop_config={"lr": 0.1},
                          scaling_config=ScalingConfig(num_workers=2)).fit()
"""
from __future__ import annotations

import logging
import secrets
import time
from typing import Any, Callable, Dict, Optional, Union

from ..checkpoint.checkpoint import Checkpoint
from ..errors import ConfigError, GroupError
from ..group.datasets import check_datasets
from ..validate import fail, not_supported
from ..worker import framework as frameworks
from ..worker.report_api import ValidationConfig
from .autoinit import install
from .config import BackendConfig, DataConfig, RunConfig, ScalingConfig, TorchConfig
from .fit_run import FitRun, storage_path_for
from .local_mode import LocalRun
from .train_loop import takes_config
from .trial import OLD_FORM, current_trial

logger = logging.getLogger(__name__)

# A script's first implicit ray.init() (e.g. ray.data.from_items) starts the quiet embedded instance.


def install_autoinit() -> None:
    """Make Ray's implicit start (and Ray Tune's, once Tune is loaded) start the embedded instance."""
    install()


#: How a run resumes here (instead of ``Trainer.restore(path)``).
RESUME = ("create the trainer again with the same RunConfig(name=..., storage_path=...): it resumes from that run's "
          "newest checkpoint")


def check_validation(cls: str, validation_config: Any) -> None:
    """Check Ray Train's ``validation_config`` (validation of reported checkpoints in tasks of their own).

    Raises:
        ConfigError: it is not a ``ValidationConfig``.
    """
    if validation_config is not None and not isinstance(validation_config, ValidationConfig):
        fail(cls, "validation_config", validation_config, "pass raytrain_nb.ValidationConfig(fn)")


def _check_type(cls: str, field: str, value: Any, kind: type, hint: str) -> None:
    if value is not None and not isinstance(value, kind):
        fail(cls, field, value, hint)


class DataParallelTrainer:
    """Runs ``train_loop_per_worker`` on N workers (Ray Train's ``DataParallelTrainer``).

    Args:
        train_loop_per_worker: the training function; it takes no argument or the config dict.
        train_loop_config: the dict passed to it (each worker gets its own copy).
        backend_config: a :class:`BackendConfig` (or ``TorchConfig``); default backend ``"none"`` (no process
            group).
        scaling_config: workers and resources (default: 1 worker, 1 CPU).
        run_config: name, storage, failures, checkpoints, callbacks.
        datasets: ``{"train": ray.data.Dataset, ...}``, split across workers; read on each
            worker with ``raytrain_nb.get_dataset_shard(name)``.
        dataset_config: a :class:`DataConfig` (which datasets to split).
        resume_from_checkpoint: what ``get_checkpoint()`` returns until the run has a
            checkpoint of its own (Ray Train V2 refuses it).
        metadata: a dict every worker reads with ``get_context().get_metadata()`` (Ray Train V2 refuses it).
        validation_config: a ``ValidationConfig``: ``report(..., validation=True)`` validates that checkpoint with its
            function in a Ray task apart from the workers; ``fit()`` waits for pending validations.
        backend: ``"gloo"``, ``"nccl"`` or ``"none"``: a shorthand for ``backend_config`` (not in Ray Train).

    Raises:
        ConfigError: a bad argument, naming it and its value (checked here, not in ``fit``).
    """

    _default_backend: Optional[str] = "none"
    _backend_config_cls: type = BackendConfig

    def __init__(self, train_loop_per_worker: Callable[..., Any], *,
                 train_loop_config: Optional[Dict[str, Any]] = None, backend_config: Optional[BackendConfig] = None,
                 scaling_config: Optional[ScalingConfig] = None, run_config: Optional[RunConfig] = None,
                 datasets: Optional[Dict[str, Any]] = None, dataset_config: Optional[DataConfig] = None,
                 resume_from_checkpoint: Optional[Any] = None, metadata: Optional[Dict[str, Any]] = None,
                 validation_config: Optional[Any] = None, backend: Optional[str] = None) -> None:
        cls = type(self).__name__
        check_validation(cls, validation_config)
        self.validation_config = validation_config
        self.with_config = takes_config(train_loop_per_worker)
        if train_loop_config is not None and not isinstance(train_loop_config, dict):
            fail(cls, "train_loop_config", train_loop_config, "pass a dict")
        if train_loop_config and not self.with_config:
            logger.warning("%s: train_loop_config is ignored: %s takes no argument", cls,
                           getattr(train_loop_per_worker, "__name__", "the training function"))
        _check_type(cls, "scaling_config", scaling_config, ScalingConfig, "pass a raytrain_nb.ScalingConfig")
        _check_type(cls, "run_config", run_config, RunConfig, "pass a raytrain_nb.RunConfig")
        _check_type(cls, "dataset_config", dataset_config, DataConfig, "pass a raytrain_nb.DataConfig")
        _check_type(cls, "backend_config", backend_config, BackendConfig, "pass a raytrain_nb.BackendConfig")
        if backend_config is not None and backend is not None and backend_config.backend not in (None, backend):
            fail(cls, "backend", backend, f"differs from backend_config.backend={backend_config.backend!r}")
        if backend is not None:
            backend_config = self._backend_config_cls(backend=backend)
        self.backend_config = backend_config or self._backend_config_cls()
        if resume_from_checkpoint is not None:

            _check_type(cls, "resume_from_checkpoint", resume_from_checkpoint, Checkpoint,
                        "pass a raytrain_nb.Checkpoint (Checkpoint.from_directory(path))")
        if datasets is not None:

            try:
                datasets = check_datasets(datasets)
            except GroupError as exc:
                raise ConfigError(f"{cls}: {exc}") from None
        if metadata is not None and not isinstance(metadata, dict):
            fail(cls, "metadata", metadata, "pass a dict")
        self.train_loop_per_worker = train_loop_per_worker
        self.train_loop_config = train_loop_config
        self.scaling_config = scaling_config or ScalingConfig()
        self.run_config = run_config or RunConfig()
        self.datasets = datasets or {}
        self.dataset_config = dataset_config or DataConfig()
        self.resume_from_checkpoint = resume_from_checkpoint
        self.metadata = metadata or {}
        trial = current_trial()  # inside a Ray Tune trial the run is named after it
        self.name = self.run_config.name or (trial.run_name() if trial is not None else
                                             f"{cls}_{time.strftime('%Y-%m-%d_%H-%M-%S')}_{secrets.token_hex(2)}")
        self.backend = self._resolve_backend()

        self.storage_path = storage_path_for(self.run_config)
        install_autoinit()

    @property
    def pg_timeout_s(self) -> Optional[float]:
        """The process group timeout ``TorchConfig(timeout_s=...)`` sets, when it is not the default (1800 s)."""
        timeout = getattr(self.backend_config, "timeout_s", None)
        return timeout if timeout is not None and timeout != TorchConfig.timeout_s else None

    @property
    def fresh_processes(self) -> str:
        """Why every failure starts fresh processes for every rank (the backend's library cannot form its
        collective again in a live process); "" when survivors keep theirs."""
        backend = frameworks.find(self.backend)
        return backend.fresh_processes if backend is not None else ""

    def _resolve_backend(self) -> str:
        backend = self.backend_config.backend or self._default_backend
        if backend is None:  # torch: nccl on GPUs, gloo otherwise
            backend = "nccl" if self.scaling_config.group_kwargs()["gpus_per_worker"] else "gloo"
        if backend == "nccl" and not self.scaling_config.group_kwargs()["gpus_per_worker"]:
            fail(type(self).__name__, "backend", backend, "nccl needs GPUs: set ScalingConfig(use_gpu=True), "
                  "or use gloo")
        return backend

    def fit(self) -> Any:
        """Run the training function on every worker until it returns on all of them.

        A worker that raises or dies is handled by ``RunConfig(failure_config=...)``: the group
        is restarted (or resized, for an elastic ``num_workers=(min, max)``) and the function runs
        again; ``get_checkpoint()`` then returns the newest committed checkpoint. With
        ``ScalingConfig(num_workers=0)`` the function runs in this process instead (local mode, see
        :mod:`.local_mode`), and what it raises propagates as it was raised.

        Returns:
            A :class:`~raytrain_nb.Result` (``error`` is None: a failed run raises); ``return_value`` is
            what the function returned on rank 0.

        Raises:
            WorkerGroupError: the function failed more often than ``max_failures`` allows (its
                message holds each rank's traceback, ``worker_failures`` each rank's exception).
            ControllerError: the run could not start or recover its workers, e.g. the cluster
                cannot place them (``controller_failure``: the ``ResourceError``).
        """
        if self.scaling_config.num_workers == 0:
            return LocalRun(self).run()
        logging_config = self.run_config.logging_config
        if logging_config is None:  # the loggers stay as the script set them
            return FitRun(self).run()
        with logging_config.applied():
            return FitRun(self).run()

    @classmethod
    def restore(cls, *args: Any, **kwargs: Any) -> "DataParallelTrainer":
        """Ray Train's restore of an interrupted run from its path: not supported (Ray Train V2 refuses it too).

        Raises:
            NotSupportedError: naming the way a run resumes here.
        """
        raise not_supported(f"{cls.__name__}.restore()", RESUME)

    @classmethod
    def can_restore(cls, *args: Any, **kwargs: Any) -> bool:
        """Whether Ray Train could restore a run from its path: not supported (Ray Train V2 refuses it too).

        Raises:
            NotSupportedError: naming the way a run resumes here.
        """
        raise not_supported(f"{cls.__name__}.can_restore()", RESUME)

    # Ray Train V1's tune.Tuner(trainer) is refused at once: Tune's Tuner(...) reads ``_name`` of a callable
    # trainable while it is built (before that, it only pickles it), and a trial would call it.
    @property
    def _name(self) -> str:
        raise ConfigError(OLD_FORM.format(cls=type(self).__name__))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Refused: a trainer is not a Tune trainable (Ray Train V1's ``tune.Tuner(trainer)``).

        Raises:
            ConfigError: naming the function-trainable pattern that replaces it.
        """
        raise ConfigError(OLD_FORM.format(cls=type(self).__name__))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(name={self.name!r}, num_workers={self.scaling_config.num_workers!r}, "
                f"backend={self.backend!r})")


class TorchTrainer(DataParallelTrainer):
    """Ray Train's ``TorchTrainer``: a :class:`DataParallelTrainer` with torch.distributed set up
    (gloo on CPUs, nccl with ``use_gpu``); use ``prepare_model`` / ``prepare_data_loader`` inside.

    Args:
        torch_config: a :class:`TorchConfig` (e.g. ``TorchConfig(backend="gloo")``).
        Others: as :class:`DataParallelTrainer` (``backend_config`` is a synonym of ``torch_config``).

    Example::

        trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=2),
                               run_config=RunConfig(failure_config=FailureConfig(max_failures=2)))
        result = trainer.fit()
    """

    _default_backend = None
    _backend_config_cls = TorchConfig

    def __init__(self, train_loop_per_worker: Callable[..., Any], *,
                 train_loop_config: Optional[Dict[str, Any]] = None, torch_config: Optional[TorchConfig] = None,
                 scaling_config: Optional[ScalingConfig] = None, run_config: Optional[RunConfig] = None,
                 datasets: Optional[Dict[str, Any]] = None, dataset_config: Optional[DataConfig] = None,
                 validation_config: Optional[Any] = None, metadata: Optional[Dict[str, Any]] = None,
                 resume_from_checkpoint: Optional[Any] = None,
                 backend_config: Optional[Union[TorchConfig, BackendConfig]] = None) -> None:
        if torch_config is not None and backend_config is not None:
            fail("TorchTrainer", "backend_config", backend_config, "pass torch_config or backend_config, not both")
        config = torch_config if torch_config is not None else backend_config
        _check_type("TorchTrainer", "torch_config", config, BackendConfig, "pass a raytrain_nb.torch.TorchConfig")
        if config is not None and config.backend == "none":
            fail("TorchTrainer", "torch_config", config, "TorchTrainer needs gloo or nccl")
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config, backend_config=config,
                         scaling_config=scaling_config, run_config=run_config, datasets=datasets,
                         dataset_config=dataset_config, resume_from_checkpoint=resume_from_checkpoint,
                         metadata=metadata, validation_config=validation_config)
