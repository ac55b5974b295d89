"""LightGBM on the worker group, mirroring ``ray.train.lightgbm`` (needs ``raytrain_nb[lightgbm]``)."""
from ._internal.frameworks.boosting import get_network_params
from ._internal.frameworks.lightgbm_utils import (LightGBMCheckpoint, RayTrainReportCallback,
                                                  normalize_pandas_for_lightgbm)
from ._internal.train.boosting import LightGBMConfig, LightGBMTrainer
from ._internal.train.trainer import install_autoinit

install_autoinit()  # Ray's implicit ray.init() in a script starts the quiet embedded instance

__all__ = ["LightGBMCheckpoint", "LightGBMConfig", "LightGBMTrainer", "RayTrainReportCallback",
           "get_network_params", "normalize_pandas_for_lightgbm"]
