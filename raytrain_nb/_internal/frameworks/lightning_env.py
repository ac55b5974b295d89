"""Lightning's cluster environment of a worker, and the check that a strategy trains on the group (worker side)."""
from __future__ import annotations

from typing import Any

import torch.distributed as dist

from ..extras import require
from ..worker.session import current_session, get_context

require("lightning")  # a missing install is named as the package, in one line
_LightningEnvironment = require("lightning.pytorch.plugins.environments").LightningEnvironment


class RayLightningEnvironment(_LightningEnvironment):
    """Lightning's cluster environment of a worker: rank and size read from ``get_context()`` at every call.

    Nothing is cached, so after a restart or a rescale the next ``fit`` sees the new world size.
    Pass it as ``pl.Trainer(plugins=[RayLightningEnvironment()])`` (Ray Train's name).
    """

    @property
    def creates_processes_externally(self) -> bool:
        """The group's workers are the processes: Lightning never launches its own."""
        return True

    def world_size(self) -> int:
        return get_context().get_world_size()

    def global_rank(self) -> int:
        return get_context().get_world_rank()

    def local_rank(self) -> int:
        return get_context().get_local_rank()

    def node_rank(self) -> int:
        return get_context().get_node_rank()

    def set_world_size(self, size: int) -> None:
        """Ignored: :meth:`world_size` reads the group's context."""

    def set_global_rank(self, rank: int) -> None:
        """Ignored: :meth:`global_rank` reads the group's context."""

    def teardown(self) -> None:
        """Nothing to undo (Lightning's own environment would delete ``WORLD_SIZE``, which the group set)."""


def check_on_group(strategy: str, environment: Any) -> None:
    """What a strategy of ours needs before Lightning sets it up: this environment, and the group's process group.

    In local mode (``ScalingConfig(num_workers=0)``) there is none: Lightning forms one of this process, as under
    Ray Train.

    Args:
        strategy: the strategy's class name, for the message.
        environment: the strategy's cluster environment.

    Raises:
        RuntimeError: another environment, or a process without the group's process group, naming the fix.
    """
    if not isinstance(environment, RayLightningEnvironment):
        raise RuntimeError(
            f"{strategy} needs Lightning's cluster environment to be RayLightningEnvironment, got "
            f"{type(environment).__name__}: pass pl.Trainer(plugins=[RayLightningEnvironment()])")
    sess = current_session()
    local = sess is not None and sess.local
    if not (dist.is_available() and dist.is_initialized()) and not local:
        raise RuntimeError(
            f"{strategy} trains on the worker group's process group and this process has none: run fit() in "
            "a %%distributed cell or a TorchTrainer's train_loop_per_worker, on a group with backend gloo or nccl")
