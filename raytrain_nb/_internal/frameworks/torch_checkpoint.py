"""``TorchCheckpoint``: a checkpoint holding a torch model's state dict (Ray Train's, deprecated there for
``Checkpoint``), saved and loaded without unpickling code.

Example::

    checkpoint = TorchCheckpoint.from_state_dict(model.state_dict())
    model = checkpoint.get_model(make_model())
"""
from __future__ import annotations

import os
import tempfile
from typing import Any, Dict, Optional

import torch

from ..checkpoint.checkpoint import FrameworkCheckpoint
from ..errors import CheckpointError
from ..validate import not_supported


def _without_ddp_prefix(state_dict: Dict[str, Any]) -> Dict[str, Any]:
    """A DDP wrapper's state dict (every key ``module.``-prefixed) as its module's."""
    if state_dict and all(isinstance(k, str) and k.startswith("module.") for k in state_dict):
        return {k[len("module."):]: v for k, v in state_dict.items()}
    return dict(state_dict)


class TorchCheckpoint(FrameworkCheckpoint):
    """A :class:`~raytrain_nb.Checkpoint` holding a model's state dict as ``model.pt`` (Ray Train's
    ``TorchCheckpoint``). Its files load with ``torch.load(weights_only=True)``: a stored whole module
    (``from_model``) would run code from the checkpoint when loaded, so it is refused."""

    MODEL_FILENAME = "model.pt"

    @classmethod
    def from_state_dict(cls, state_dict: Dict[str, Any], *, preprocessor: Any = None) -> "TorchCheckpoint":
        """Save ``state_dict`` (a DDP wrapper's ``module.`` prefix dropped) into a new temporary directory.

        Raises:
            CheckpointError: a ``preprocessor`` is given (not supported).
        """
        if preprocessor is not None:
            raise CheckpointError(f"{cls.__name__}.from_state_dict(preprocessor=...) is not supported: save what "
                                  "the preprocessor needs into the checkpoint directory yourself")
        directory = tempfile.mkdtemp(prefix="torch_checkpoint_")
        torch.save(_without_ddp_prefix(state_dict), os.path.join(directory, cls.MODEL_FILENAME))
        return cls.from_directory(directory)

    @classmethod
    def from_model(cls, model: torch.nn.Module, *, preprocessor: Any = None) -> "TorchCheckpoint":
        """Save a whole module by pickling it: not supported.

        Raises:
            NotSupportedError: naming ``from_state_dict``.
        """
        raise not_supported(f"{cls.__name__}.from_model() (a whole module, pickled: loading it runs code from the "
                            "checkpoint; Ray Train deprecates it for that reason)",
                            f"use {cls.__name__}.from_state_dict(model.state_dict()) and get_model(make_model())")

    def get_model(self, model: Optional[torch.nn.Module] = None) -> torch.nn.Module:
        """Load the stored state dict into ``model`` (on the CPU) and return it.

        Raises:
            NotSupportedError: no ``model`` is given (the checkpoint holds weights, not a module).
            CheckpointError: the checkpoint has no ``model.pt``.
        """
        if model is None:
            raise not_supported(f"{type(self).__name__}.get_model() without a model (unpickling a whole module)",
                                "pass a module of the same architecture: get_model(make_model())")
        with self.as_directory() as directory:
            path = os.path.join(directory, self.MODEL_FILENAME)
            if not os.path.exists(path):
                raise CheckpointError(f"{self!r} has no {self.MODEL_FILENAME}: it was not made by "
                                      f"{type(self).__name__}.from_state_dict")
            state = torch.load(path, map_location="cpu", weights_only=True)
        model.load_state_dict(_without_ddp_prefix(state))
        return model
