"""Lightning's FSDP2 route on the group: ``ModelParallelStrategy`` with its device mesh sized to the group."""
from __future__ import annotations

import contextlib
import logging
from typing import Any, Iterator, Tuple

import torch

from ..extras import require
from ..validate import fail, is_int, not_supported
from ..worker.sharded import is_sharded
from ..worker.torch_utils import get_device
from .lightning_carry import carry_optimizer_state, remember_optimizers
from .lightning_env import check_on_group

require("lightning")  # a missing install is named as the package, in one line
_ModelParallelStrategy = require("lightning.pytorch.strategies").ModelParallelStrategy

logger = logging.getLogger(__name__)

#: What a mesh over the group is asked as, for the messages.
NAME = "ModelParallelStrategy"


def check_sizes(data_parallel_size: Any, tensor_parallel_size: Any) -> None:
    """Refuse, in one line, sizes no mesh over the group can have: tensor parallel (a 2-D mesh), or a size that is
    neither ``"auto"`` nor a whole number above 0.

    Raises:
        NotSupportedError: ``tensor_parallel_size`` above 1.
        ConfigError: a size of another kind.
    """
    for field, value in (("data_parallel_size", data_parallel_size), ("tensor_parallel_size", tensor_parallel_size)):
        if value != "auto" and not (is_int(value) and value > 0):
            fail(NAME, field, value, "pass 'auto' or a whole number above 0")
    if tensor_parallel_size not in ("auto", 1):
        raise not_supported(
            f"{NAME}(tensor_parallel_size={tensor_parallel_size!r}) (a 2-D mesh: tensor parallel)",
            "pass tensor_parallel_size=1 (FSDP2 over every rank of the group), as prepare_model(model, "
            "parallel_strategy='fsdp2') shards")


def mesh_sizes(data_parallel_size: Any, tensor_parallel_size: Any, world_size: int) -> Tuple[int, int]:
    """The mesh ``(data_parallel_size, tensor_parallel_size)`` over a group of ``world_size`` ranks: ``"auto"``
    fills the data-parallel size with the world size (Lightning's own ``"auto"`` would take the number of nodes),
    and the tensor-parallel size is 1.

    Raises:
        NotSupportedError: ``tensor_parallel_size`` above 1.
        ConfigError: a ``data_parallel_size`` other than the world size.
    """
    check_sizes(data_parallel_size, tensor_parallel_size)
    if data_parallel_size not in ("auto", world_size):
        fail(NAME, "data_parallel_size", data_parallel_size,
             f"the mesh spans the group's {world_size} ranks: pass data_parallel_size={world_size} or 'auto'")
    return world_size, 1


class RayModelParallelStrategy(_ModelParallelStrategy):
    """Lightning's ``ModelParallelStrategy`` (FSDP2) on the worker group's process group, its mesh sized to the group.

    The module's ``configure_model`` shards it with ``fully_shard(..., mesh=self.device_mesh["data_parallel"])``,
    as in Lightning's guide; its parameters are then ``DTensor`` shards, so snapshots, rollback and the mirrors
    treat it as any FSDP2 model. ``data_parallel_size="auto"`` is the group's world size (at every ``fit``: after a
    rescale, the new one); ``tensor_parallel_size`` must be 1 or ``"auto"``. ``prepare_trainer`` turns Lightning's own
    ``ModelParallelStrategy`` into this one. Lightning calls ``configure_model`` at every ``fit``: a later cell's
    ``fit`` of the same module needs it to return at once when the module is sharded already (Lightning's rule).

    Each rank saves its shards to the path it is given and loads from its own (Lightning would use rank 0's path on
    every rank), so ``RayTrainReportCallback``'s checkpoint is every rank's files in one reported checkpoint, and
    ``fit(ckpt_path=...)`` resumes from it, also across nodes.

    Args:
        keep_optimizer_state: carry the optimizers' per-parameter state (their shards) from the module's previous
            ``fit``, as :class:`RayDDPStrategy` does; only when every rank can (never a peer's shards).
        *args, **kwargs: as ``lightning.pytorch.strategies.ModelParallelStrategy`` (``data_parallel_size``,
            ``tensor_parallel_size``, ``save_distributed_checkpoint``...).

    Raises:
        NotSupportedError: ``tensor_parallel_size`` above 1 (when made, and when ``fit`` starts).

    Example::

        trainer = pl.Trainer(strategy=RayModelParallelStrategy(), plugins=[RayLightningEnvironment()])
        trainer.fit(model, train_dataloaders=loader)
    """

    def __init__(self, *args: Any, keep_optimizer_state: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keep_optimizer_state = keep_optimizer_state
        self.take_sizes()

    def take_sizes(self) -> None:
        """Keep the sizes asked for (``"auto"`` is worked out again at every ``fit``) and refuse what cannot be."""
        self.asked_sizes = (self._data_parallel_size, self._tensor_parallel_size)
        self.paths_per_rank = False
        check_sizes(*self.asked_sizes)

    @classmethod
    def adopt(cls, strategy: Any) -> "RayModelParallelStrategy":
        """Make Lightning's own ``ModelParallelStrategy`` object this class, in place (the Trainer holds it).

        Raises:
            NotSupportedError: its ``tensor_parallel_size`` is above 1 (the object is left as it was).
        """
        if isinstance(strategy, cls):
            return strategy
        old = type(strategy)
        strategy.__class__ = cls
        try:
            strategy.keep_optimizer_state = True
            strategy.take_sizes()
        except Exception:
            strategy.__class__ = old
            raise
        return strategy

    @property
    def root_device(self) -> torch.device:
        return get_device()

    def setup_environment(self) -> None:
        """Check the environment and the process group, size the mesh to the group, then Lightning's setup."""
        check_on_group(type(self).__name__, self.cluster_environment)
        self._data_parallel_size, self._tensor_parallel_size = mesh_sizes(
            *self.asked_sizes, self.cluster_environment.world_size())
        super().setup_environment()

    @contextlib.contextmanager
    def model_sharded_context(self) -> Iterator[None]:
        """Around ``configure_model``: a module sharded by a previous ``fit`` and sharded again is named in one line."""
        module = self.lightning_module
        before = module is not None and is_sharded(module)
        with super().model_sharded_context():
            try:
                yield
            except AssertionError as exc:
                if before and "fully_shard" in str(exc):
                    raise RuntimeError(
                        f"{type(module).__name__}.configure_model applied fully_shard again to a module a previous "
                        "fit sharded: Lightning calls configure_model at every fit, so return at once when the "
                        "module is sharded (e.g. `if isinstance(self.layer.weight, DTensor): return`)") from exc
                raise

    def setup_optimizers(self, trainer: Any) -> None:
        """Lightning's optimizers for this fit; then the previous fit's state where every rank has it."""
        super().setup_optimizers(trainer)
        module = self.lightning_module
        if module is None:
            return
        if self.keep_optimizer_state:
            carried = carry_optimizer_state(module, self.optimizers, from_peer=False)
            if carried and self.global_rank == 0:
                logger.info("fit continues the optimizer state of the module's previous fit (%s)", carried)
        remember_optimizers(module, self.optimizers)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Lightning's broadcast, except for the path of a checkpoint being saved or loaded (each rank's own)."""
        if self.paths_per_rank:
            return obj
        return super().broadcast(obj, src)

    def save_checkpoint(self, checkpoint: Any, filepath: Any, storage_options: Any = None) -> None:
        """Lightning's save, into the path this rank was given (each rank writes its own shards there)."""
        with self._own_paths():
            super().save_checkpoint(checkpoint, filepath, storage_options)

    def load_checkpoint(self, checkpoint_path: Any, weights_only: Any = None) -> Any:
        """Lightning's load, from the path this rank was given (a copy of the whole checkpoint on its node)."""
        with self._own_paths():
            return super().load_checkpoint(checkpoint_path, weights_only)

    @contextlib.contextmanager
    def _own_paths(self) -> Iterator[None]:
        self.paths_per_rank = True
        try:
            yield
        finally:
            self.paths_per_rank = False
