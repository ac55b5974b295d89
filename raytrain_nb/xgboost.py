"""XGBoost on the worker group, mirroring ``ray.train.xgboost`` (needs ``raytrain_nb[xgboost]``)."""
from ._internal.frameworks.xgboost_utils import RayTrainReportCallback, XGBoostCheckpoint
from ._internal.train.boosting import XGBoostConfig, XGBoostTrainer
from ._internal.train.trainer import install_autoinit

install_autoinit()  # Ray's implicit ray.init() in a script starts the quiet embedded instance

__all__ = ["RayTrainReportCallback", "XGBoostCheckpoint", "XGBoostConfig", "XGBoostTrainer"]
