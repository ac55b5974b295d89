"""``XGBoostTrainer`` / ``LightGBMTrainer`` and their configs: Ray Train's trainers on the framework backends.

Each is a :class:`~.trainer.DataParallelTrainer` whose group runs the ``xgboost`` or ``lightgbm`` framework
backend (``frameworks/boosting.py``): every attempt of the training function runs inside XGBoost's
communicator (a tracker started on the driver for it), or with ``get_network_params()`` set to the group's
current machines. Failures, restarts and ``get_checkpoint()`` are the ``DataParallelTrainer``'s.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, Optional

from ..validate import fail
from .config import BackendConfig, DataConfig, RunConfig, ScalingConfig
from .trainer import DataParallelTrainer

LEGACY = ("{cls}(label_column=..., params=..., num_boost_round=...) is Ray Train's legacy API and is not supported: "
          "pass a train_loop_per_worker that calls {lib}.train(...) instead")


@dataclasses.dataclass
class XGBoostConfig(BackendConfig):
    """XGBoost's collective (Ray Train's ``XGBoostConfig``).

    Args:
        xgboost_communicator: only ``"rabit"`` (a tracker on the driver, the communicator on every rank).
    """

    backend: Optional[str] = dataclasses.field(default="xgboost", init=False)
    xgboost_communicator: str = "rabit"

    def __post_init__(self) -> None:
        if self.backend not in (None, "xgboost"):
            fail("XGBoostConfig", "backend", self.backend, "XGBoostConfig's backend is 'xgboost'")
        self.backend = "xgboost"
        if self.xgboost_communicator != "rabit":
            fail("XGBoostConfig", "xgboost_communicator", self.xgboost_communicator, "only 'rabit' is supported")

    def to_dict(self) -> Dict[str, Any]:
        return {"xgboost_communicator": self.xgboost_communicator}


@dataclasses.dataclass
class LightGBMConfig(BackendConfig):
    """LightGBM's network (Ray Train's ``LightGBMConfig``): ``get_network_params()`` gives each rank its
    ``machines``, ``local_listen_port`` and ``num_machines``."""

    backend: Optional[str] = dataclasses.field(default="lightgbm", init=False)

    def __post_init__(self) -> None:
        if self.backend not in (None, "lightgbm"):
            fail("LightGBMConfig", "backend", self.backend, "LightGBMConfig's backend is 'lightgbm'")
        self.backend = "lightgbm"

    def to_dict(self) -> Dict[str, Any]:
        return {}


class _BoostingTrainer(DataParallelTrainer):
    _library = ""

    @classmethod
    def get_model(cls, checkpoint: Any) -> Any:
        """Deprecated in Ray Train 2.60: use ``RayTrainReportCallback.get_model``."""
        raise DeprecationWarning(f"{cls.__name__}.get_model is deprecated: use RayTrainReportCallback.get_model")

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, train_loop_config: Optional[Dict[str, Any]],
                 config: Optional[BackendConfig], scaling_config: Optional[ScalingConfig],
                 run_config: Optional[RunConfig], datasets: Optional[Dict[str, Any]],
                 dataset_config: Optional[DataConfig], resume_from_checkpoint: Optional[Any],
                 metadata: Optional[Dict[str, Any]], validation_config: Optional[Any], legacy: bool) -> None:
        cls = type(self).__name__
        if legacy:
            raise DeprecationWarning(LEGACY.format(cls=cls, lib=self._library))
        if config is not None and not isinstance(config, self._backend_config_cls):
            fail(cls, f"{self._library}_config", config, f"pass a raytrain_nb.{self._library}."
                 f"{self._backend_config_cls.__name__}")
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config,
                         backend_config=config or self._backend_config_cls(), scaling_config=scaling_config,
                         run_config=run_config, datasets=datasets, dataset_config=dataset_config,
                         resume_from_checkpoint=resume_from_checkpoint, metadata=metadata,
                         validation_config=validation_config)


class XGBoostTrainer(_BoostingTrainer):
    """Ray Train's ``XGBoostTrainer``: ``train_loop_per_worker`` runs on every worker inside XGBoost's
    collective, so its ``xgboost.train(...)`` trains one model over every worker's shard.

    Args:
        xgboost_config: an :class:`XGBoostConfig` (default ``rabit``).
        Others: as :class:`~raytrain_nb.DataParallelTrainer`. Ray's legacy ``label_column``, ``params`` and
        ``num_boost_round`` raise ``DeprecationWarning``, as in Ray Train 2.60.

    Example::

        trainer = XGBoostTrainer(train_fn_per_worker, datasets={"train": train_ds},
                                 scaling_config=ScalingConfig(num_workers=2))
        booster = RayTrainReportCallback.get_model(trainer.fit().checkpoint)
    """

    _default_backend = "xgboost"
    _backend_config_cls = XGBoostConfig
    _library = "xgboost"

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, train_loop_config: Optional[Dict[str, Any]] = None,
                 xgboost_config: Optional[XGBoostConfig] = None, scaling_config: Optional[ScalingConfig] = None,
                 run_config: Optional[RunConfig] = None, datasets: Optional[Dict[str, Any]] = None,
                 dataset_config: Optional[DataConfig] = None, validation_config: Optional[Any] = None,
                 metadata: Optional[Dict[str, Any]] = None, resume_from_checkpoint: Optional[Any] = None,
                 label_column: Optional[str] = None,
                 params: Optional[Dict[str, Any]] = None, num_boost_round: Optional[int] = None) -> None:
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config, config=xgboost_config,
                         scaling_config=scaling_config, run_config=run_config, datasets=datasets,
                         dataset_config=dataset_config, resume_from_checkpoint=resume_from_checkpoint,
                         metadata=metadata, validation_config=validation_config,
                         legacy=label_column is not None or params is not None or num_boost_round is not None)


class LightGBMTrainer(_BoostingTrainer):
    """Ray Train's ``LightGBMTrainer``: ``train_loop_per_worker`` runs on every worker with
    ``get_network_params()`` set to the group's machines, so ``lightgbm.train(params={...,
    "tree_learner": "data_parallel", **get_network_params()})`` trains one model over every worker's shard.

    Args:
        lightgbm_config: a :class:`LightGBMConfig`.
        Others: as :class:`XGBoostTrainer`.
    """

    _default_backend = "lightgbm"
    _backend_config_cls = LightGBMConfig
    _library = "lightgbm"

    def __init__(self, train_loop_per_worker: Callable[..., Any], *, train_loop_config: Optional[Dict[str, Any]] = None,
                 lightgbm_config: Optional[LightGBMConfig] = None, scaling_config: Optional[ScalingConfig] = None,
                 run_config: Optional[RunConfig] = None, datasets: Optional[Dict[str, Any]] = None,
                 dataset_config: Optional[DataConfig] = None, validation_config: Optional[Any] = None,
                 metadata: Optional[Dict[str, Any]] = None, resume_from_checkpoint: Optional[Any] = None,
                 label_column: Optional[str] = None,
                 params: Optional[Dict[str, Any]] = None, num_boost_round: Optional[int] = None) -> None:
        super().__init__(train_loop_per_worker, train_loop_config=train_loop_config, config=lightgbm_config,
                         scaling_config=scaling_config, run_config=run_config, datasets=datasets,
                         dataset_config=dataset_config, resume_from_checkpoint=resume_from_checkpoint,
                         metadata=metadata, validation_config=validation_config,
                         legacy=label_column is not None or params is not None or num_boost_round is not None)
