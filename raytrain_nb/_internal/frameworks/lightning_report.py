"""Lightning's metrics and checkpoints reported to the run: Ray Train's ``RayTrainReportCallback`` (worker side)."""
from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any, Dict

from ..checkpoint.checkpoint import Checkpoint
from ..extras import require
from ..worker.session import get_context, report

require("lightning")  # a missing install is named as the package, in one line
pl = require("lightning.pytorch")


class RayTrainReportCallback(pl.callbacks.Callback):
    """At the end of every training epoch: report ``trainer.callback_metrics`` with a checkpoint.

    The checkpoint is Lightning's own (``trainer.save_checkpoint``), one file in the reported
    checkpoint directory::

        checkpoint_00000*/
            checkpoint.ckpt

    so a resumed run continues with ``trainer.fit(model, ckpt_path=os.path.join(d, "checkpoint.ckpt"))``
    where ``d`` is ``get_checkpoint()``'s directory. The metrics (plus ``epoch`` and ``step``) go to
    ``report()``: the dashboard's rows and plot, ``Result.metrics``; the checkpoint is committed under
    the run's rules once every rank reported it, and ranked and pruned by ``CheckpointConfig``.

    Args:
        checkpoint_upload_mode: accepted for Ray Train 2.60 scripts; raytrain_nb always uploads
            before ``report`` returns (Ray Train's ``SYNC``).
        validation: must stay ``False``: asynchronous checkpoint validation is not supported.

    Raises:
        ValueError: ``validation`` was asked for.

    Example::

        trainer = pl.Trainer(..., callbacks=[RayTrainReportCallback()], enable_checkpointing=False)
    """

    CHECKPOINT_NAME = "checkpoint.ckpt"

    def __init__(self, checkpoint_upload_mode: Any = None, validation: Any = False) -> None:
        super().__init__()
        if validation:
            raise ValueError(f"RayTrainReportCallback(validation={validation!r}) is not supported by raytrain_nb: "
                             "leave validation=False and validate in the training loop")
        self.checkpoint_upload_mode = checkpoint_upload_mode
        self.validation = validation

    def on_train_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        metrics: Dict[str, Any] = dict(trainer.callback_metrics)  # report() makes 1-element tensors numbers
        metrics["epoch"] = trainer.current_epoch
        metrics["step"] = trainer.global_step
        rank = get_context().get_world_rank()
        tmpdir = tempfile.mkdtemp(prefix=f"rtnb-lightning-rank{rank}-")
        try:
            # every rank calls it (it may gather state); Lightning writes the file on rank 0 only
            trainer.save_checkpoint(os.path.join(tmpdir, self.CHECKPOINT_NAME), weights_only=False)
            report(metrics, checkpoint=Checkpoint.from_directory(tmpdir))
            trainer.strategy.barrier()  # every rank reported before any goes on
        finally:
            shutil.rmtree(tmpdir, ignore_errors=True)
