"""Weights & Biases, as Ray's ``ray.air.integrations.wandb``: ``WandbLoggerCallback`` and ``setup_wandb``.

``WandbLoggerCallback`` logs a ``fit()`` (``RunConfig(callbacks=[WandbLoggerCallback(...)])``) or a group's cells
(``group.track(WandbLoggerCallback(...))``, ``%%distributed --track wandb``) on the driver, in the background:
the config, every report's numbers with ``step=`` the run's report index (rank 0's, and ``<name>/mean`` over the
ranks where they differ), committed checkpoints as artifacts (their files with ``upload_checkpoints=True``, else a
reference to their location), and a tag and a line of the notes for each failed attempt, rollback and recovery.
The run directory keeps the W&B run id (``tracking.json``): every process segment (a restart, a resume, a new
kernel) resumes that id (``resume="allow"``), so in offline mode (``WANDB_MODE=offline``) the segments'
directories share one run id and their steps strictly increase across them. An offline run's files go to
``<run directory>/wandb`` when the run directory is local (``dir=`` sets it). W&B's console capture is off.

``setup_wandb(config)`` on a worker returns a W&B run on rank 0 and a disabled run on the other ranks.
"""
from __future__ import annotations

from .._internal.tracking.setup import setup_wandb as _setup_wandb
from .._internal.train.tracking import WandbLoggerCallback

__all__ = ["WandbLoggerCallback", "setup_wandb"]


def setup_wandb(config=None, api_key=None, api_key_file=None, rank_zero_only=True, **kwargs):
    """Set up Weights & Biases on a worker (Ray's ``setup_wandb``, same arguments).

    Rank 0 (or every rank with ``rank_zero_only=False``) sets the API key (``api_key``, or the first line of
    ``api_key_file``) and returns ``wandb.init(config=config, **kwargs)`` (project ``WANDB_PROJECT`` or
    ``raytrain_nb``, the run's name, ``reinit="create_new"`` unless given); other ranks get
    ``wandb.init(mode="disabled")``.

    Raises:
        ImportError: wandb is not installed (``pip install 'raytrain_nb[wandb]'``).
    """
    return _setup_wandb(config, api_key, api_key_file, rank_zero_only, **kwargs)
