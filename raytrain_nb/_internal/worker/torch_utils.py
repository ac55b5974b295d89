"""``prepare_model``, ``prepare_data_loader``, ``get_device`` (worker side, Ray Train names)."""
from __future__ import annotations

import logging
import os
from typing import Any, Dict, Optional, Union

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, RandomSampler

from ..backend import deferred_ddp, process_group_state
from . import session

logger = logging.getLogger(__name__)

_STRATEGIES = ("ddp", "fsdp", "fsdp2", None)


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
    move_to_device: Union[bool, torch.device] = True,
    parallel_strategy: Optional[str] = "ddp",
    parallel_strategy_kwargs: Optional[Dict[str, Any]] = None,
) -> torch.nn.Module:
    """Move a model to this worker's device and wrap it for data-parallel training.

    Args:
        model: the module to prepare.
        move_to_device: move it to :func:`get_device` first (``True``), to this device (a ``torch.device``),
            or leave it where it is (``False``).
        parallel_strategy: ``"ddp"`` (DistributedDataParallel), ``"fsdp"`` (FSDP1's
            ``FullyShardedDataParallel``, sharding parameters, gradients and optimizer state across ranks),
            ``"fsdp2"`` (our extension: FSDP2's ``fully_shard``, on CPU with gloo too; see below) or ``None``
            (no wrapping).
        parallel_strategy_kwargs: extra keyword arguments for the wrapper. For ``"fsdp2"``: ``fully_shard``'s
            (``mp_policy=MixedPrecisionPolicy(...)``, ``offload_policy=CPUOffloadPolicy()``,
            ``reshard_after_forward``, ``mesh``: a 1-D mesh; 2-D meshes are refused) and ``shard_children``.

    With ``"fsdp2"`` the policy is: ``fully_shard`` on each direct child that holds parameters (each block of a
    child that is a ``ModuleList`` / ``Sequential``), or on the submodules named in ``shard_children``, then on
    the root. The model object itself is returned (FSDP2 changes its class in place); snapshots, rollback,
    restart and rescale keep its shards (each rank writes only its own). A model you shard by hand with
    ``fully_shard`` on a 1-D mesh is handled the same way.

    Returns:
        The wrapped model. A DDP wrapper is tracked, so it is re-bound in place when the group's process group
        is re-formed (after an interrupt, a failure, or a rescale); an FSDP one is not (build it again).

    Raises:
        ValueError: for an unknown ``parallel_strategy``, or a 2-D mesh for ``"fsdp2"``.

    Example:
        >>> model = prepare_model(torch.nn.Linear(10, 1))  # doctest: +SKIP
    """
    if parallel_strategy not in _STRATEGIES:
        raise ValueError(f"prepare_model(parallel_strategy={parallel_strategy!r}): use 'ddp', 'fsdp', 'fsdp2' or None")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"prepare_model() takes a torch.nn.Module, got {type(model).__name__}")
    device = move_to_device if isinstance(move_to_device, torch.device) else get_device()
    if device.type == "cuda" and torch.cuda.is_available():
        torch.cuda.set_device(device)
    if move_to_device:
        model = model.to(device)
    state = process_group_state()
    model.register_forward_pre_hook(_count_forward)
    joined = dist.is_available() and dist.is_initialized()
    if parallel_strategy == "fsdp2":
        from .sharded import prepare_fsdp2  # FSDP2: loaded only when asked for

        return prepare_fsdp2(model, device, dict(parallel_strategy_kwargs or {}), joined, state.deferred)
    if parallel_strategy == "fsdp":
        return _fsdp(model, device, dict(parallel_strategy_kwargs or {}), joined, state.deferred)
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


def _fsdp(model: torch.nn.Module, device: torch.device, kwargs: Dict[str, Any], joined: bool,
          deferred: bool) -> torch.nn.Module:
    """``FullyShardedDataParallel(model, **kwargs)`` on this worker's device (``device_id`` defaults to it, which
    is what lets FSDP1 run on CPUs with gloo)."""
    if deferred:
        raise RuntimeError("prepare_model(parallel_strategy='fsdp') cannot run while a new rank replays the group's "
                           "setup cells: an FSDP model is sharded across the ranks that built it; build it in a cell "
                           "after the group re-formed")
    from .sharded import require_process_group  # the sharding strategies' shared checks

    require_process_group("fsdp", device, joined)
    # torch.distributed.fsdp: loaded only for FSDP (it imports much of torch.distributed)
    from torch.distributed.fsdp import FullyShardedDataParallel

    kwargs.setdefault("device_id", device)
    return FullyShardedDataParallel(model, **kwargs)


def _count_forward(module: Any, args: Any) -> None:
    process_group_state().forwards += 1


class _DeviceLoader:
    """Iterates a DataLoader and moves each batch to the worker's device; with ``prefetch`` (a CUDA device), the
    next batch is copied on a stream of its own while the current one is used."""

    def __init__(self, loader: DataLoader, device: torch.device, prefetch: bool = False) -> None:
        self.loader = loader
        self.device = device
        self.prefetch = prefetch

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
        if not self.prefetch:
            for batch in self.loader:
                yield self._move(batch)
            return
        stream = torch.cuda.Stream(self.device)
        pending = None
        for batch in self.loader:
            with torch.cuda.stream(stream):
                moved = self._move(batch)
            if pending is not None:
                yield pending
            current = torch.cuda.current_stream(self.device)
            current.wait_stream(stream)
            _record_stream(moved, current)  # freed memory is not reused by the copy stream while training reads it
            pending = moved
        if pending is not None:
            yield pending


def _record_stream(batch: Any, stream: Any) -> None:
    if isinstance(batch, torch.Tensor):
        batch.record_stream(stream)
    elif isinstance(batch, (list, tuple)):
        for item in batch:
            _record_stream(item, stream)
    elif isinstance(batch, dict):
        for item in batch.values():
            _record_stream(item, stream)


def _rank_and_world() -> "tuple[int, int]":

    sess = session.current_session()
    if sess is not None:
        ctx = sess.context
        return ctx.world_rank, ctx.world_size
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def prepare_data_loader(data_loader: DataLoader, add_dist_sampler: bool = True, move_to_device: bool = True,
                        auto_transfer: bool = True) -> Any:
    """Shard a DataLoader across workers and move its batches to the device.

    Args:
        data_loader: a ``torch.utils.data.DataLoader``.
        add_dist_sampler: replace its sampler with a ``DistributedSampler`` (shuffling if the loader
            shuffled); a loader over an ``IterableDataset`` keeps its own.
        move_to_device: yield batches already on :func:`get_device`.
        auto_transfer: on a GPU, copy the next batch to the device on a CUDA stream of its own while the
            current one trains (as Ray Train does); nothing on a CPU.

    Returns:
        A loader to iterate like the original (``set_epoch`` reaches the sampler).
    """
    if not isinstance(data_loader, DataLoader):
        raise TypeError(f"prepare_data_loader() takes a torch DataLoader, got {type(data_loader).__name__}")
    loader = data_loader
    rank, world = _rank_and_world()
    # A DistributedSampler even at world size 1, so a rescale can re-shard it in place.
    if add_dist_sampler and not isinstance(loader.sampler, DistributedSampler) \
            and not isinstance(loader.dataset, IterableDataset):
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
        return _DeviceLoader(loader, device, auto_transfer and device.type == "cuda")
    return loader
