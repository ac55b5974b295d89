"""Transformers on the group, as ``ray.train.huggingface.transformers`` names it: ``prepare_trainer`` and
``RayTrainReportCallback`` (needs ``pip install 'raytrain_nb[transformers]'``).

Example::

    from raytrain_nb.huggingface.transformers import RayTrainReportCallback, prepare_trainer

    trainer = transformers.Trainer(model=model, args=args, train_dataset=train_ds)
    trainer.add_callback(RayTrainReportCallback())
    trainer = prepare_trainer(trainer)
    trainer.train()
"""
from __future__ import annotations

from .._internal.frameworks.transformers_utils import RayTrainReportCallback, prepare_trainer

__all__ = ["RayTrainReportCallback", "prepare_trainer"]
