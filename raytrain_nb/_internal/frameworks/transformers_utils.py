"""Transformers' ``Trainer`` on the group: Ray Train's ``RayTrainReportCallback`` and ``prepare_trainer`` (worker side).

A ``Trainer`` made in a ``%%distributed`` cell or a trainer's loop already trains on the group's process
group (Accelerate finds it initialised; the worker sets the variables Accelerate reads). The callback
sends what the ``Trainer`` logs to ``report()`` and each checkpoint it saves as a reported checkpoint:
rank 0 uploads the files, every other rank its own RNG state, so nothing is copied twice or half-written.
"""
from __future__ import annotations

import collections.abc
import logging
import os
import re
import shutil
import tempfile
from typing import Any, Dict, List, Optional

import torch.utils.data

from ..checkpoint.checkpoint import Checkpoint
from ..extras import require
from ..worker.session import get_context, report

transformers = require("transformers")
require("transformers.trainer")

logger = logging.getLogger(__name__)

#: A file one process writes for itself into a Transformers checkpoint (``rng_state_3.pth``).
_PER_PROCESS = re.compile(r"^rng_state_(\d+)\.pth$")


def files_of_rank(checkpoint_dir: str, rank: int) -> List[str]:
    """The files of a Transformers checkpoint directory that ``rank`` uploads (paths relative to it).

    Rank 0 writes the model, optimizer, scheduler and trainer state (``args.should_save``), and each
    process its own ``rng_state_<rank>.pth``: rank 0 uploads all but the other ranks' RNG files, every
    other rank only its own RNG file. The same split holds whether the ranks share ``output_dir`` or not.
    """
    out = []
    for folder, _, names in os.walk(checkpoint_dir):
        for name in names:
            rel = os.path.relpath(os.path.join(folder, name), checkpoint_dir)
            match = _PER_PROCESS.match(rel)
            if (match is not None and int(match.group(1)) == rank) or (match is None and rank == 0):
                out.append(rel)
    return sorted(out)


def merged_metrics(log_history: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Every entry of ``TrainerState.log_history`` merged, newest last (as Ray Train reports them)."""
    metrics: Dict[str, Any] = {}
    for entry in log_history:
        metrics.update(entry)
    return metrics


def saved_checkpoint(output_dir: str, global_step: int) -> Optional[str]:
    """The checkpoint folder the ``Trainer`` saved at ``global_step`` (else the newest in ``output_dir``).

    Ray Train takes the newest by name, which may be an older run's when ``output_dir`` is reused.
    """
    exact = os.path.join(output_dir, f"{transformers.trainer.PREFIX_CHECKPOINT_DIR}-{global_step}")
    if os.path.isdir(exact):
        return exact
    return transformers.trainer.get_last_checkpoint(output_dir) if os.path.isdir(output_dir) else None


class RayTrainReportCallback(transformers.TrainerCallback):
    """Report a ``Trainer``'s metrics and checkpoints (Ray Train's ``RayTrainReportCallback``).

    On every log, the metrics logged so far (merged, as Ray Train reports them) go to ``report()``, so
    the dashboard's rows and plot follow training; on every save, they go with the checkpoint just saved,
    as a reported checkpoint laid out as in Ray Train::

        checkpoint_00000N/     the reported checkpoint
        └─ checkpoint/         the Transformers checkpoint (resume with trainer.train(resume_from_checkpoint=...))

    Every rank reports the same number of times (the ``Trainer`` calls callbacks on every rank).

    Example:
        >>> trainer.add_callback(RayTrainReportCallback())   # doctest: +SKIP
    """

    CHECKPOINT_NAME = "checkpoint"

    def on_log(self, args: Any, state: Any, control: Any, logs: Optional[Dict[str, Any]] = None,
               **kwargs: Any) -> None:
        """Report the metrics logged so far (no checkpoint)."""
        report(merged_metrics(state.log_history), total=state.max_steps or None)

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        """Report the metrics logged so far with the checkpoint just saved."""
        metrics = merged_metrics(state.log_history)
        source = saved_checkpoint(args.output_dir, state.global_step)
        if source is None:
            logger.warning("no checkpoint found in %s after a save; reporting the metrics only", args.output_dir)
            report(metrics, total=state.max_steps or None)
            return
        rank = get_context().get_world_rank()
        with tempfile.TemporaryDirectory(prefix="rtnb-hf-") as tmp:
            target = os.path.join(tmp, self.CHECKPOINT_NAME)
            os.makedirs(target)
            for rel in files_of_rank(source, rank):
                os.makedirs(os.path.dirname(os.path.join(target, rel)), exist_ok=True)
                shutil.copy2(os.path.join(source, rel), os.path.join(target, rel))
            report(metrics, checkpoint=Checkpoint.from_directory(tmp), total=state.max_steps or None)


class _IterableBatches(torch.utils.data.IterableDataset):
    """Batches from an iterable (a Ray Data shard's ``iter_torch_batches()``), as a dataset."""

    def __init__(self, batches: Any) -> None:
        super().__init__()
        self.batches = batches

    def __iter__(self) -> Any:
        return iter(self.batches)


def _first(batch: List[Any]) -> Any:
    return batch[0]


def is_batch_iterable(dataset: Any) -> bool:
    """An iterable of ready batches (no length, no indexing): a Ray Data shard's batches, a generator."""
    return (isinstance(dataset, collections.abc.Iterable) and not isinstance(dataset, torch.utils.data.Dataset)
            and not isinstance(dataset, (collections.abc.Sized, dict, str)))


def batch_loader(batches: Any) -> Any:
    """A ``DataLoader`` that yields each batch of ``batches`` as it is."""
    return torch.utils.data.DataLoader(_IterableBatches(batches), batch_size=1, collate_fn=_first)


class BatchIterables:
    """What ``prepare_trainer`` adds to a ``Trainer``'s class: datasets that are iterables of batches."""

    def get_train_dataloader(self) -> Any:
        if is_batch_iterable(self.train_dataset):
            return batch_loader(self.train_dataset)
        return super().get_train_dataloader()

    def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
        chosen = self.eval_dataset if eval_dataset is None else eval_dataset
        if isinstance(chosen, str) and isinstance(self.eval_dataset, dict):
            chosen = self.eval_dataset[chosen]
        if is_batch_iterable(chosen):
            return batch_loader(chosen)
        return super().get_eval_dataloader(eval_dataset)


class RayTransformersTrainer(BatchIterables, transformers.Trainer):
    """A ``transformers.Trainer`` after ``prepare_trainer`` (a module-level class, so it pickles)."""


#: Trainer subclasses prepared so far -> their prepared class.
_PREPARED: Dict[type, type] = {transformers.Trainer: RayTransformersTrainer}


def prepare_trainer(trainer: Any) -> Any:
    """Prepare a ``transformers.Trainer`` for the group (Ray Train's ``prepare_trainer``).

    Datasets that are iterables of ready batches (``get_dataset_shard("train").iter_torch_batches(...)``)
    are fed to the ``Trainer`` as they are, as Ray Train does; and the ``Trainer`` is checked to train on
    the whole group. Returns the same ``trainer`` (its class becomes a subclass of its own).

    Raises:
        TypeError: ``trainer`` is not a ``transformers.Trainer``.
        ValueError: the ``Trainer`` sees another world size than the group's.
    """
    if not isinstance(trainer, transformers.Trainer):
        raise TypeError(f"prepare_trainer() takes a transformers.Trainer, got {type(trainer).__name__}: "
                        "build one with transformers.Trainer(model=..., args=...) first")
    world = get_context().get_world_size()
    if trainer.args.world_size != world:
        raise ValueError(f"the Trainer sees a world of {trainer.args.world_size} process(es) but the group has "
                         f"{world}: make TrainingArguments inside the %%distributed cell or train_func, "
                         "without ddp_backend or use_cpu settings that disagree with the group")
    base = type(trainer)
    if not isinstance(trainer, BatchIterables):
        if base not in _PREPARED:
            _PREPARED[base] = type(f"Ray{base.__name__}", (BatchIterables, base), {"__module__": base.__module__})
        trainer.__class__ = _PREPARED[base]
    return trainer
