"""``prepare_model``, ``prepare_data_loader``, ``get_device`` (worker side, Ray Train names)."""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, RandomSampler

from ..backend import deferred_ddp, process_group_state
from . import session

logger = logging.getLogger(__name__)

_STRATEGIES = ("ddp", None)


def get_device() -> torch.device:
    """The device this worker should train on: its GPU, or the CPU.

    Each worker sees only the GPU(s) Ray assigned to it, so this is
    ``cuda:<current device>`` on a GPU worker and ``cpu`` otherwise.
    """
    if torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "") not in ("", "-1"):
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def prepare_model(
    model: torch.nn.Module,
    move_to_device: bool = True,
    parallel_strategy: Optional[str] = "ddp",
    parallel_strategy_kwargs: Optional[Dict[str, Any]] = None,
) -> torch.nn.Module:
    """Move a model to this worker's device and wrap it for data-parallel training.

    Args:
        model: the module to prepare.
        move_to_device: move it to :func:`get_device` first.
        parallel_strategy: ``"ddp"`` (DistributedDataParallel) or ``None`` (no wrapping).
        parallel_strategy_kwargs: extra keyword arguments for the wrapper.

    Returns:
        The wrapped model. The wrapper is tracked, so it is re-bound in place
        when the group's process group is re-formed (after an interrupt,
        a failure, or a rescale).

    Raises:
        ValueError: for an unsupported ``parallel_strategy`` (``"fsdp"`` too).

    Example:
        >>> model = prepare_model(torch.nn.Linear(10, 1))  # doctest: +SKIP
    """
    if parallel_strategy not in _STRATEGIES:
        raise ValueError(
            f"parallel_strategy={parallel_strategy!r} is not supported; use 'ddp' or None "
            "(FSDP is not supported yet)"
        )
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"prepare_model() takes a torch.nn.Module, got {type(model).__name__}")
    device = get_device()
    if move_to_device:
        model = model.to(device)
    state = process_group_state()
    model.register_forward_pre_hook(_count_forward)
    joined = dist.is_available() and dist.is_initialized()
    if parallel_strategy is None or not (joined or state.deferred):
        return model
    kwargs = dict(parallel_strategy_kwargs or {})
    if device.type == "cuda":
        kwargs.setdefault("device_ids", [device.index])
        kwargs.setdefault("output_device", device.index)
    if state.deferred:  # a new rank replaying setup cells: wrap when the group forms
        wrapper = deferred_ddp(model, kwargs)
    else:
        # torch: loaded on first use, not on import raytrain_nb
        from torch.nn.parallel import DistributedDataParallel as DDP

        wrapper = DDP(model, **kwargs)
        wrapper._rtnb_ddp_kwargs = kwargs
    state.track(wrapper)
    return wrapper


def _count_forward(module: Any, args: Any) -> None:
    process_group_state().forwards += 1


class _DeviceLoader:
    """Iterates a DataLoader and moves each batch to the worker's device."""

    def __init__(self, loader: DataLoader, device: torch.device) -> None:
        self.loader = loader
        self.device = device

    def __len__(self) -> int:
        return len(self.loader)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.loader, name)

    def _move(self, batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return batch.to(self.device, non_blocking=True)
        if isinstance(batch, (list, tuple)):
            return type(batch)(self._move(b) for b in batch)
        if isinstance(batch, dict):
            return {k: self._move(v) for k, v in batch.items()}
        return batch

    def __iter__(self):
        for batch in self.loader:
            yield self._move(batch)


def _rank_and_world() -> "tuple[int, int]":

    sess = session.current_session()
    if sess is not None:
        ctx = sess.context
        return ctx.world_rank, ctx.world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def prepare_data_loader(loader: DataLoader, add_dist_sampler: bool = True,
                        move_to_device: bool = True) -> Any:
    """Shard a DataLoader across workers and move its batches to the device.

    Args:
        loader: a ``torch.utils.data.DataLoader``.
        add_dist_sampler: replace its sampler with a ``DistributedSampler``
            (shuffling if the loader shuffled).
        move_to_device: yield batches already on :func:`get_device`.

    Returns:
        A loader to iterate like the original (``set_epoch`` reaches the sampler).
    """
    if not isinstance(loader, DataLoader):
        raise TypeError(f"prepare_data_loader() takes a torch DataLoader, got {type(loader).__name__}")
    rank, world = _rank_and_world()
    # A DistributedSampler even at world size 1, so a rescale can re-shard it in place.
    if add_dist_sampler and not isinstance(loader.sampler, DistributedSampler):
        shuffle = isinstance(loader.sampler, RandomSampler)
        sampler = DistributedSampler(loader.dataset, num_replicas=world, rank=rank, shuffle=shuffle)
        process_group_state().track_sampler(sampler)
        loader = DataLoader(
            loader.dataset,
            batch_size=loader.batch_size,
            sampler=sampler,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            drop_last=loader.drop_last,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            persistent_workers=loader.persistent_workers if loader.num_workers else False,
        )
    device = get_device()
    if move_to_device and device.type != "cpu":
        return _DeviceLoader(loader, device)
    return loader
