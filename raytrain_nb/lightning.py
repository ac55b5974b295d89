"""PyTorch Lightning on the worker group, mirroring ``ray.train.lightning`` (needs ``raytrain_nb[lightning]``)."""
from ._internal.frameworks.lightning import (RayDDPStrategy, RayDeepSpeedStrategy, RayFSDPStrategy,
                                             RayLightningEnvironment, prepare_trainer)
from ._internal.frameworks.lightning_parallel import RayModelParallelStrategy
from ._internal.frameworks.lightning_report import RayTrainReportCallback

__all__ = ["prepare_trainer", "RayDDPStrategy", "RayFSDPStrategy", "RayDeepSpeedStrategy",
           "RayLightningEnvironment", "RayTrainReportCallback", "RayModelParallelStrategy"]
