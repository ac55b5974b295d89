"""``TuneReportCallback``: every report of a trial's run reaches Ray Tune, as Ray Train V2's callback of that name.

Ray Train's callback runs in its controller actor and hands rank 0's metrics (with the committed
checkpoint's path) to the trial through a queue actor. Here the run's driver *is* the trial's
function, on the trial's own thread, so each report goes straight to ``ray.tune.report``: Tune's
schedulers, searchers, stoppers and ``ResultGrid`` see every report as it is committed, and a
scheduler that stops the trial stops it there (Tune ends the trial's thread inside that call,
the ``fit()`` unwinds and shuts its group down: workers killed, placement group removed).

Example::

    def driver_fn(config):
        TorchTrainer(train_fn, train_loop_config=config,
                     scaling_config=ScalingConfig(num_workers=2),
                     run_config=RunConfig(callbacks=[TuneReportCallback()])).fit()

    tune.Tuner(driver_fn, param_space={"lr": tune.loguniform(1e-3, 1e-1)}, ...).fit()
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

from ..checkpoint.storage import is_local
from ..extras import require
from ..train.callbacks import UserCallback
from ..train.trial import current_trial

logger = logging.getLogger(__name__)

#: The metric that carries the committed checkpoint's path (Ray Train's key).
CHECKPOINT_PATH_KEY = "checkpoint_path"


class TuneReportCallback(UserCallback):
    """Forward each report of the run to Ray Tune: rank 0's metrics and the committed checkpoint.

    Args:
        copy_checkpoints: also hand each committed checkpoint to Tune
            (``ray.tune.report(..., checkpoint=...)``), which copies it into the trial's directory,
            so ``ResultGrid``'s ``result.checkpoint`` is one (pruned by ``tune.RunConfig``'s
            ``checkpoint_config``). With False only its path goes, in ``metrics["checkpoint_path"]``,
            as Ray Train's callback does. The path is in the metrics either way.

    Raises:
        RuntimeError: created outside a Ray Tune trial (as Ray Train's).
        ImportError: Ray Tune is not installed (naming the pip install).

    Example::

        RunConfig(callbacks=[TuneReportCallback()])
    """

    def __init__(self, copy_checkpoints: bool = True) -> None:
        self._tune = require("ray.tune")
        if current_trial() is None:
            raise RuntimeError("TuneReportCallback must be used in a Tune session: create it inside the function "
                               "that tune.Tuner(driver_fn, ...) runs (see docs/tune.md)")
        self.copy_checkpoints = bool(copy_checkpoints)
        self._warned = False

    def after_report(self, metrics: List[Dict[str, Any]], checkpoint: Optional[Any]) -> None:
        """Report rank 0's ``metrics`` (and ``checkpoint``, when one was committed) to Tune.

        Tune may end the trial's thread inside this call (a scheduler stopped the trial): that
        ``SystemExit`` is left to unwind the run, which shuts its workers down.
        """
        row = dict(metrics[0]) if metrics else {}
        handed = None
        if checkpoint is not None:
            url = getattr(checkpoint, "url", None) or str(checkpoint.path)
            row[CHECKPOINT_PATH_KEY] = url
            if self.copy_checkpoints:
                handed = self._tune_checkpoint(checkpoint, url)
        self._tune.report(row, checkpoint=handed)

    def _tune_checkpoint(self, checkpoint: Any, url: str) -> Optional[Any]:
        """A ``ray.tune.Checkpoint`` of ``url`` that Tune can read to copy, or None (said once)."""
        try:
            if is_local(checkpoint.filesystem):
                return self._tune.Checkpoint.from_directory(checkpoint.path)
            handed = self._tune.Checkpoint(url)
            handed.filesystem.get_file_info(handed.path)  # pyarrow must reach it with the environment's settings
            return handed
        except Exception as exc:  # noqa: BLE001 - the metrics (with the path) still go to Tune
            if not self._warned:
                self._warned = True
                logger.warning("TuneReportCallback: Tune cannot read the checkpoint at %s (%s); only its path goes "
                               "to Tune, in metrics[%r]", url, exc, CHECKPOINT_PATH_KEY)
            return None
