"""What a user may hold for a checkpoint (a path, a URL, a ``Checkpoint``, an index entry, a result), as one ``Checkpoint``."""
from __future__ import annotations

import os
from typing import Any

from ..errors import CheckpointError
from .checkpoint import Checkpoint


def as_checkpoint(source: Any, what: str = "checkpoint") -> Checkpoint:
    """``source`` as a :class:`Checkpoint`.

    Args:
        source: a local path or fsspec URL; a :class:`Checkpoint`; an entry of
            ``group.checkpoints()`` (or what ``group.checkpoint()`` returns); a result with a
            ``checkpoint`` (``trainer.fit()``'s, or Ray Tune's ``ResultGrid.get_best_result()``);
            a ``ray.train.Checkpoint`` / ``ray.tune.Checkpoint`` (path and filesystem).
        what: the call, as errors name it.

    Raises:
        CheckpointError: ``source`` is none of these, or a result without a checkpoint.
    """
    if isinstance(source, Checkpoint):
        return source
    if isinstance(source, str):
        return Checkpoint(source)
    if hasattr(source, "checkpoint") and not callable(source.checkpoint):  # an entry or a result
        if source.checkpoint is None:
            raise CheckpointError(f"{what}: {type(source).__name__} has no checkpoint: its trial reported none "
                                  "(report(metrics, checkpoint=...)); pick a result that has one")
        return as_checkpoint(source.checkpoint, what)
    path, filesystem = getattr(source, "path", None), getattr(source, "filesystem", None)
    if isinstance(path, str) and filesystem is not None:  # ray.train.Checkpoint: a path on a pyarrow filesystem
        if type(filesystem).__name__ == "LocalFileSystem":  # a plain local path, as users and errors write it
            return Checkpoint(path)
        return Checkpoint(path, filesystem=filesystem)
    if isinstance(source, os.PathLike):
        return Checkpoint(source)
    raise CheckpointError(f"{what}: {source!r} is not a checkpoint: pass a path or URL, a raytrain_nb.Checkpoint, "
                          "an entry of group.checkpoints() or a result (result.checkpoint)")
