"""Lightning on the group's process group: Ray Train's strategy, environment and ``prepare_trainer`` (worker side)."""
from __future__ import annotations

import logging
from typing import Any, Dict

import torch
import torch.distributed as dist

from ..extras import require
from ..worker.torch_utils import get_device
from .lightning_carry import carry_optimizer_state, remember_optimizers
from .lightning_env import RayLightningEnvironment, check_on_group
from .lightning_parallel import RayModelParallelStrategy

require("lightning")  # a missing install is named as the package, in one line
pl = require("lightning.pytorch")

logger = logging.getLogger(__name__)

#: What raytrain_nb trains Lightning with, as refusals name it.
SUPPORTED = ("RayDDPStrategy (DDP on the group's process group); for a model sharded over the ranks use FSDP2: "
             "Lightning's ModelParallelStrategy (or RayModelParallelStrategy) with fully_shard in configure_model, "
             "its mesh the group's ranks (tensor_parallel_size=1), or prepare_model(model, "
             "parallel_strategy='fsdp2') in a torch loop")


class RayDDPStrategy(pl.strategies.DDPStrategy):
    """Lightning's ``DDPStrategy`` on the worker group's process group (Ray Train's ``RayDDPStrategy``).

    Lightning finds ``torch.distributed`` already initialised and trains on it; it never starts
    processes or a process group of its own. ``process_group_backend``, ``timeout`` and
    ``start_method`` have no effect: the group's backend (``--backend``, ``TorchConfig``) decides.

    A second ``fit`` of the same LightningModule in this process (a later notebook cell, with a new
    or the same ``Trainer``) continues from its warm weights and, with ``keep_optimizer_state``
    (the default), from the per-parameter state (momentum, Adam's moments) of the optimizers its
    previous ``fit`` made, when ``configure_optimizers`` returns the same kinds of them; learning
    rates and LR schedulers are this ``fit``'s own (a new schedule). ``fit(ckpt_path=...)`` loads
    the checkpoint's state over it. Ranks that joined since (a rescale) get that state from a peer.

    Args:
        keep_optimizer_state: carry the optimizers' state from the module's previous ``fit``.
        *args, **kwargs: as ``lightning.pytorch.strategies.DDPStrategy`` (``find_unused_parameters``...).

    Example::

        trainer = pl.Trainer(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()],
                             callbacks=[RayTrainReportCallback()], devices="auto", accelerator="auto")
        trainer = prepare_trainer(trainer)
        trainer.fit(model, train_dataloaders=loader)
    """

    def __init__(self, *args: Any, keep_optimizer_state: bool = True, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.keep_optimizer_state = keep_optimizer_state

    @property
    def root_device(self) -> torch.device:
        return get_device()

    @property
    def distributed_sampler_kwargs(self) -> Dict[str, Any]:
        return dict(num_replicas=self.world_size, rank=self.global_rank)

    def setup_distributed(self) -> None:
        """Use the group's process group (Lightning skips its own when one exists)."""
        check_on_group(type(self).__name__, self.cluster_environment)
        super().setup_distributed()
        self._process_group_backend = dist.get_backend()

    def setup_optimizers(self, trainer: Any) -> None:
        """Lightning's optimizers for this fit; then the previous fit's optimizer state where it fits (see the class)."""
        module = self.lightning_module
        super().setup_optimizers(trainer)
        if module is None:
            return
        if self.keep_optimizer_state:
            carried = carry_optimizer_state(module, self.optimizers)
            if carried and self.global_rank == 0:
                logger.info("fit continues the optimizer state of the module's previous fit (%s)", carried)
        remember_optimizers(module, self.optimizers)


class _Refused:
    """A Ray Train strategy raytrain_nb does not offer: refused when constructed, in one line."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(f"{type(self).__name__} is not supported by raytrain_nb; supported: {SUPPORTED}")

    # Ray Train's members of these strategies, for the same names (no instance exists to reach them).
    @property
    def root_device(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} is not supported by raytrain_nb; supported: {SUPPORTED}")

    @property
    def distributed_sampler_kwargs(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} is not supported by raytrain_nb; supported: {SUPPORTED}")


class RayFSDPStrategy(_Refused):
    """Ray Train's FSDP strategy: not supported (raises on construction; use :class:`RayDDPStrategy`)."""

    def lightning_module_state_dict(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} is not supported by raytrain_nb; supported: {SUPPORTED}")


class RayDeepSpeedStrategy(_Refused):
    """Ray Train's DeepSpeed strategy: not supported (raises on construction; use :class:`RayDDPStrategy`)."""


def prepare_trainer(trainer: Any) -> Any:
    """Check a ``lightning.pytorch.Trainer`` for training on the group and return it (Ray Train's name).

    Lightning's own ``ModelParallelStrategy`` (FSDP2) becomes a :class:`RayModelParallelStrategy` in place: its
    mesh sized to the group (``data_parallel_size="auto"``: the world size), the worker's device, each rank's own
    checkpoint path.

    Args:
        trainer: a Trainer made with ``strategy=RayDDPStrategy()`` (or Lightning's ``ModelParallelStrategy()``,
            or ``RayModelParallelStrategy()``) and ``plugins=[RayLightningEnvironment()]``.

    Returns:
        The same trainer.

    Raises:
        RuntimeError: another strategy, or another cluster environment, naming what to pass instead.
        NotSupportedError: a ``ModelParallelStrategy`` with ``tensor_parallel_size`` above 1.

    Example::

        trainer = prepare_trainer(pl.Trainer(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()]))
    """
    strategy = getattr(trainer, "strategy", None)
    if isinstance(strategy, pl.strategies.ModelParallelStrategy):
        strategy = RayModelParallelStrategy.adopt(strategy)
    elif not isinstance(strategy, RayDDPStrategy):
        raise RuntimeError(f"prepare_trainer: the trainer's strategy is {type(strategy).__name__}; supported: "
                           f"{SUPPORTED}: pass pl.Trainer(strategy=RayDDPStrategy())")
    environment = getattr(strategy, "cluster_environment", None)
    if environment is not None and not isinstance(environment, RayLightningEnvironment):
        raise RuntimeError(f"prepare_trainer: the trainer's cluster environment is {type(environment).__name__}: "
                           "pass pl.Trainer(plugins=[RayLightningEnvironment()])")
    return trainer
