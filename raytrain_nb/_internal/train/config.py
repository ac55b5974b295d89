"""Ray Train's configuration classes, validated on construction.

``ScalingConfig`` (``scaling_config.py``), ``RunConfig``, ``FailureConfig``, ``CheckpointConfig``,
``DataConfig``, ``LoggingConfig``, ``SyncConfig``, ``TorchConfig`` and ``BackendConfig``
(``backend_config.py``) take Ray Train's arguments in Ray Train's order, by name or by position
(``RunConfig("exp")``), so a ported script builds them unchanged. Every field is checked in
``__post_init__``; a bad value raises :class:`ConfigError` (a ``ValueError``) in one line naming the
class, the field and the value. Arguments Ray Train has but this project cannot honour raise
:class:`NotSupportedError` (a ``ConfigError`` and a ``NotImplementedError``), naming them, instead of
being ignored.

Example::

    ScalingConfig(num_workers=(2, 4), use_gpu=False)      # elastic: between 2 and 4 workers
    RunConfig(name="mnist", storage_path="s3://bucket/runs",
              failure_config=FailureConfig(max_failures=3))
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from ..checkpoint.storage import as_fsspec
from ..errors import StorageError
from ..group.datasets import split_datasets
from ..validate import fail, is_int, is_number, not_supported, refuse
from .backend_config import BackendConfig, TorchConfig  # noqa: F401 - imported from here by the trainers
from .scaling_config import ScalingConfig  # noqa: F401 - imported from here by the trainers

@dataclasses.dataclass
class FailureConfig:
    """How often a failed run is restarted (Ray Train's ``FailureConfig``).

    Args:
        max_failures: restarts allowed after a worker dies or raises: ``0`` (default) fails
            at once, ``-1`` restarts without limit. A worker lost with its node (a preempted spot
            instance too) counts here: preemptions are not told apart.
        fail_fast: Ray Tune's option; only ``False`` is accepted.
        controller_failure_limit: Ray Train's restarts of its controller actor; there is none here (the
            driver process runs the run), so only the default ``-1`` and ``0`` are accepted.
        max_preemption_failures, relax_collectives_on_preemption, preemption_grace_s: Ray Train's handling
            of node preemption notices, which are not received here: only the defaults are accepted.

    Raises:
        ConfigError: naming the field and the bad value (``NotSupportedError`` for what cannot be honoured).
    """

    max_failures: int = 0
    fail_fast: Union[bool, str] = False
    controller_failure_limit: int = -1
    max_preemption_failures: int = -1
    relax_collectives_on_preemption: bool = False
    preemption_grace_s: float = 0.0

    def __post_init__(self) -> None:
        if not is_int(self.max_failures) or self.max_failures < -1:
            fail("FailureConfig", "max_failures", self.max_failures,
                  "pass a whole number >= 0, or -1 for no limit")
        refuse("FailureConfig", self, {"fail_fast": False}, "{field} is a Ray Tune option; use max_failures=0")
        if self.controller_failure_limit not in (-1, 0):
            refuse("FailureConfig", self, {"controller_failure_limit": -1}, "there is no controller actor to "
                   "restart (the driver process runs the run): leave the default")
        refuse("FailureConfig", self, {"max_preemption_failures": -1, "relax_collectives_on_preemption": False,
                                       "preemption_grace_s": 0.0},
               "preemption notices are not received here: a preempted node's workers are lost workers, recovered "
               "under max_failures from the newest checkpoint; leave the default")


@dataclasses.dataclass
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


@dataclasses.dataclass
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
        worker_runtime_env: a Ray runtime environment (a dict or ``ray.runtime_env.RuntimeEnv``) for the
            workers' actors, e.g. ``{"env_vars": {"KEY": "value"}}``.
        logging_config: a :class:`LoggingConfig`: the level of this library's logs while ``fit()`` runs.
        verbose: ``0`` hides the progress line; ``None``/``1``/``2`` show it (Ray Train V2 refuses it).
        sync_config, stop, progress_reporter, log_to_file: Ray Tune options that are not supported (raise
            when set, as in Ray Train V2).

    Raises:
        ConfigError: naming the field and the bad value (``NotSupportedError`` for what cannot be honoured).
    """

    name: Optional[str] = None
    storage_path: Optional[str] = None
    storage_filesystem: Optional[Any] = None
    failure_config: Optional[FailureConfig] = None
    checkpoint_config: Optional[CheckpointConfig] = None
    callbacks: Optional[List[Any]] = None
    worker_runtime_env: Optional[Dict[str, Any]] = None
    logging_config: Optional["LoggingConfig"] = None
    sync_config: Optional[Any] = None
    verbose: Optional[int] = None
    stop: Optional[Any] = None
    progress_reporter: Optional[Any] = None
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
        if self.worker_runtime_env is not None and not isinstance(self.worker_runtime_env, dict):
            fail("RunConfig", "worker_runtime_env", self.worker_runtime_env, "pass a dict such as "
                 "{'env_vars': {'KEY': 'value'}} (or a ray.runtime_env.RuntimeEnv)")
        if self.logging_config is not None and not isinstance(self.logging_config, LoggingConfig):
            fail("RunConfig", "logging_config", self.logging_config, "pass a raytrain_nb.LoggingConfig")
        refuse("RunConfig", self, {"stop": None, "sync_config": None, "progress_reporter": None,
                                    "log_to_file": False},
                "{field} is a Ray Tune option, refused by Ray Train V2 too")

    @property
    def max_failures(self) -> int:
        return (self.failure_config or FailureConfig()).max_failures

    @property
    def storage_context(self) -> Any:
        """Ray Train's ``StorageContext`` (a developer API): not supported.

        Raises:
            NotSupportedError: naming where the run's files are.
        """
        raise not_supported("RunConfig.storage_context (Ray Train's StorageContext)",
                            "the run directory is <storage_path>/<name>; result.path names it after fit()")


@dataclasses.dataclass
class LoggingConfig:
    """The level of this library's logs while a trainer's ``fit()`` runs (Ray Train's ``LoggingConfig``).

    Args:
        log_level: a ``logging`` level name (``"DEBUG"``, ``"INFO"``, ...), any case; stored upper-case.

    Raises:
        ConfigError: an unknown level, naming it.
    """

    log_level: str = "INFO"

    def __post_init__(self) -> None:
        if not isinstance(self.log_level, str) or not isinstance(logging.getLevelName(self.log_level.upper()), int):
            fail("LoggingConfig", "log_level", self.log_level, "use a logging level: DEBUG, INFO, WARNING, ERROR or "
                 "CRITICAL")
        self.log_level = self.log_level.upper()

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """Set the ``raytrain_nb`` loggers to this level for the block, then back."""
        logger = logging.getLogger("raytrain_nb")
        before = logger.level
        logger.setLevel(self.log_level)
        try:
            yield
        finally:
            logger.setLevel(before)


@dataclasses.dataclass
class SyncConfig:
    """Ray Tune's syncing of trial files (Ray Train's ``SyncConfig``, deprecated there): it can be built, and
    ``RunConfig(sync_config=...)`` refuses it, as Ray Train V2 does. Every file of a run is written to the run's
    storage directly, so there is nothing to sync."""

    sync_period: int = 300
    sync_timeout: int = 1800
    sync_artifacts: bool = False
    sync_artifacts_on_checkpoint: bool = True


@dataclasses.dataclass
class DataConfig:
    """Which datasets are split across workers, and how (Ray Train's ``DataConfig``).

    Args:
        datasets_to_split: ``"all"`` (default) or a list of dataset names; the others are
            given whole to every worker.
        execution_options: not supported (raise when set).
        enable_shard_locality: give Ray Data each rank's node as a locality hint when splitting, so
            that blocks are read where they are consumed (default, as in Ray Train).

    Raises:
        ConfigError: naming the field and the bad value.
    """

    datasets_to_split: Union[str, Sequence[str]] = "all"
    execution_options: Optional[Any] = None
    enable_shard_locality: bool = True

    def __post_init__(self) -> None:
        d = self.datasets_to_split
        if d != "all" and (isinstance(d, str) or not isinstance(d, (list, tuple))
                           or not all(isinstance(n, str) for n in d)):
            fail("DataConfig", "datasets_to_split", d, "pass 'all' or a list of dataset names")
        if not isinstance(self.enable_shard_locality, bool):
            fail("DataConfig", "enable_shard_locality", self.enable_shard_locality, "pass True or False")
        refuse("DataConfig", self, {"execution_options": None}, "{field} is not supported")

    def splits(self, name: str) -> bool:
        return self.datasets_to_split == "all" or name in self.datasets_to_split

    def configure(self, datasets: Dict[str, Any], world_size: int, worker_handles: Optional[List[Any]],
                  worker_node_ids: Optional[List[str]], **kwargs: Any) -> List[Dict[str, Any]]:
        """Each rank's ``DataIterator`` of every dataset (Ray Train's hook: a subclass may override it).

        Args:
            datasets: ``{name: ray.data.Dataset}``.
            world_size: the number of ranks.
            worker_handles: Ray Train passes the workers' actors; None here (the group holds them).
            worker_node_ids: each rank's node id, the locality hints with ``enable_shard_locality``.

        Returns:
            One ``{name: DataIterator}`` per rank, in rank order.
        """
        hints = worker_node_ids if self.enable_shard_locality else None
        return split_datasets(datasets, world_size, self.splits, hints)

    @staticmethod
    def default_ingest_options() -> Any:
        """Ray Train's default Ray Data execution options for ingest: not supported (``execution_options`` is
        refused, so Ray Data's own defaults apply).

        Raises:
            NotSupportedError: saying Ray Data's defaults apply.
        """
        raise not_supported("DataConfig.default_ingest_options()", "execution options cannot be set here; Ray "
                            "Data's defaults apply (ray.data.DataContext.get_current().execution_options)")
