"""PyTorch helpers and the trainer, mirroring ``ray.train.torch``."""
from ._internal.frameworks.torch_checkpoint import TorchCheckpoint
from ._internal.train.config import TorchConfig
from ._internal.train.trainer import TorchTrainer, install_autoinit
from ._internal.worker.torch_compat import (accelerate, backward, enable_reproducibility, get_devices,
                                           prepare_optimizer)
from ._internal.worker.torch_utils import get_device, prepare_data_loader, prepare_model


def dcp_to_torch_save(dcp_checkpoint_dir: str, torch_save_path: str, *, allow_pickle: bool = False) -> dict:
    """Gather a sharded checkpoint (PyTorch DCP: a sharded snapshot's ``sharded/`` folder, or what a training loop
    saved with ``torch.distributed.checkpoint``) into one ``torch.save`` file for inference in one process.

    Our extension: ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` with DCP's ``.metadata`` read
    by a restricted unpickler (only DCP's metadata classes; ``allow_pickle=True`` for storage you trust). It
    needs memory for the whole model in this process. Returns the full state dict it wrote.

    Example:
        >>> state = dcp_to_torch_save(entry.path + "/sharded", "model.pt")  # doctest: +SKIP
        >>> model.load_state_dict(state["model"]["model"])  # doctest: +SKIP
    """
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from ._internal.worker.dcp_safe import to_torch_save

    return to_torch_save(str(dcp_checkpoint_dir), str(torch_save_path), allow_pickle)

install_autoinit()  # Ray's implicit ray.init() in a script starts the quiet embedded instance

__all__ = ["TorchCheckpoint", "TorchConfig", "TorchTrainer", "accelerate", "backward", "dcp_to_torch_save",
           "enable_reproducibility",
           "get_device", "get_devices", "prepare_data_loader", "prepare_model", "prepare_optimizer"]
