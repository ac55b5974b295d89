"""Local mode (``ScalingConfig(num_workers=0)``): the training function runs in the calling process, as Ray Train V2.

For debugging with an ordinary debugger (a breakpoint in the training function stops in your own process): no
worker, no run directory, no lease. ``get_context()`` says rank 0 of 1, ``report()`` keeps only the last metrics
and checkpoint, ``get_checkpoint()`` returns that checkpoint (before the first one: ``resume_from_checkpoint``),
``get_dataset_shard(name)`` the dataset given to the trainer, whole. An exception of the function propagates as
it was raised: no retries.

Where Ray Train keeps the reported ``Checkpoint`` object as given (so a checkpoint written in a ``with
tempfile.TemporaryDirectory()`` block is gone once ``report()`` returns), a copy of its files is kept here, in a
temporary directory of its own (the previous report's copy is removed; the last one at exit): the result's
checkpoint loads after the run.

Started by ``torchrun`` (its ``RANK``, ``WORLD_SIZE``, ... in the environment), a torch trainer forms one process
group over those processes first (nccl with CUDA, else gloo), as Ray Train does, and the context says each
process's rank; Ray Data is refused there (each process would read the whole dataset).

Example::

    result = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=0)).fit()
    result.metrics, result.checkpoint, result.return_value      # result.path is None
"""
from __future__ import annotations

import atexit
import logging
import os
import shutil
import sys
from typing import TYPE_CHECKING, Any, Dict, Optional

from ..checkpoint.checkpoint import Checkpoint
from ..errors import ConfigError
from ..worker import session
from .result import Result
from .train_loop import call_loop

if TYPE_CHECKING:  # the trainer calls in here; this module never imports it at run time
    from .trainer import DataParallelTrainer

logger = logging.getLogger(__name__)

#: What ``torchrun`` sets in each process it starts (``init_process_group(init_method="env://")`` reads them).
TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
#: The backends whose trainers form a torch process group under ``torchrun``.
TORCH_BACKENDS = ("gloo", "nccl")


def started_by_torchrun(env: Optional[Dict[str, str]] = None) -> bool:
    """Whether this process was started by ``torchrun`` (every one of :data:`TORCHRUN_VARS` is set)."""
    env = os.environ if env is None else env
    return all(name in env for name in TORCHRUN_VARS)


class LocalRun:
    """One ``fit()`` in local mode: the function in this process, its last report kept in memory."""

    def __init__(self, trainer: "DataParallelTrainer") -> None:
        self.t = trainer
        self.checkpoint: Any = None
        self.copy = ""  # the directory of the kept checkpoint's files (ours to remove)
        self.formed = False  # a process group formed during the run, ours (torchrun) or a library's (Lightning)

    def run(self) -> Result:
        """Run the training function here and return what it reported last and returned.

        Raises:
            ConfigError: Ray Data datasets under a multi-process ``torchrun``.
            Exception: whatever the training function raised, as it was raised.
        """
        if self.t.run_config.callbacks:
            logger.info("local mode: RunConfig(callbacks=...) are not called (no run to report on)")
        context = self._context()
        sess = session.WorkerSession(context, history=1)  # only the last report is kept
        sess.local = True
        sess.upload = self._keep
        sess.latest = lambda: self.checkpoint
        before, shards = session.current_session(), session.dataset_shards()
        session.set_session(sess)
        try:
            session.replace_shards(dict(self.t.datasets))
            value = call_loop(self.t.train_loop_per_worker, self.t.train_loop_config, self.t.with_config,
                              self.t.resume_from_checkpoint, self.t.metadata)
        finally:
            session.set_session(before)
            session.replace_shards(shards)
            self._leave()
            if self.copy:
                atexit.register(shutil.rmtree, self.copy, True)
        records = sess.drain()
        return Result(metrics=records[-1]["metrics"] if records else None, checkpoint=self.checkpoint, error=None,
                      path=None, return_value=value)

    def _keep(self, index: int, checkpoint: Any, metrics: Dict[str, Any]) -> None:
        """``report(checkpoint=...)``: keep a copy of its files (the previous copy goes)."""
        if not isinstance(checkpoint, Checkpoint):
            raise TypeError(f"report(checkpoint=...) takes a raytrain_nb.Checkpoint, got {type(checkpoint).__name__}: "
                            "pass Checkpoint.from_directory(path)")
        copy, previous = checkpoint.to_directory(), self.copy
        self.checkpoint, self.copy = Checkpoint.from_directory(copy), copy
        if previous:
            shutil.rmtree(previous, ignore_errors=True)

    def _context(self) -> session.TrainContext:
        """Rank 0 of 1; under ``torchrun`` (a torch trainer outside a worker), this process's place in the group
        it forms."""
        name = self.t.name
        self.formed = not _joined()  # none yet: one formed during the run is the run's
        if (self.t.backend not in TORCH_BACKENDS or not started_by_torchrun()
                or session.current_session() is not None):
            return session.TrainContext(world_rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0,
                                        experiment_name=name)
        import torch  # torch: loaded by torch trainers only, not on import raytrain_nb
        import torch.distributed as dist  # torch: as above

        local_rank, local_size = int(os.environ["LOCAL_RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
        if not dist.is_initialized():
            dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
            if torch.cuda.is_available():
                torch.cuda.set_device(local_rank)
        rank, size = dist.get_rank(), dist.get_world_size()
        if size > 1 and self.t.datasets:
            self._leave()
            raise ConfigError(f"{type(self.t).__name__}(datasets={sorted(self.t.datasets)}): Ray Data is not "
                              f"supported in local mode under torchrun ({size} processes): load data with a torch "
                              "DataLoader and prepare_data_loader, or use num_workers >= 1")
        return session.TrainContext(world_rank=rank, world_size=size, local_rank=local_rank,
                                    local_world_size=local_size, node_rank=rank // max(local_size, 1),
                                    experiment_name=name)

    def _leave(self) -> None:
        """Destroy a process group formed during the run (a group it found stays)."""
        if self.formed and _joined():
            import torch.distributed as dist  # torch: already loaded (the group was formed with it)

            dist.destroy_process_group()
        self.formed = False


def _joined() -> bool:
    """Whether this process has a torch process group (without importing torch when nothing did)."""
    dist = sys.modules.get("torch.distributed")
    return dist is not None and dist.is_available() and dist.is_initialized()

