"""Broadcast many tensors from one rank in few collectives: tensors of one dtype and device kind packed into
flat buckets of at most :data:`BUCKET_BYTES` (a tensor larger than that goes alone, in place).

Bringing a model in line after a process group re-formed broadcast each tensor of its state dict on its own: a
collective each, which on 16 ranks sharing 2 cores costs several milliseconds whatever its size. Packed, a small
model costs one. Every rank must call :func:`broadcast_tensors` with tensors of the same shapes and dtypes in the
same order (the caller checked the shapes first), so every rank forms the same buckets.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional, Sequence, Tuple

#: The most bytes a packed bucket holds (each rank holds one extra copy of a bucket while it is sent).
BUCKET_BYTES = 32 << 20


def buckets(sizes: Sequence[Tuple[Any, int]], cap: Optional[int] = None) -> List[List[int]]:
    """The indices of the tensors of ``sizes`` (``(key, bytes)`` each, the key their dtype and device kind) grouped
    into buckets of one key and at most ``cap`` bytes (default :data:`BUCKET_BYTES`), in order of their first
    tensor; a tensor over ``cap`` is a bucket of its own."""
    cap = BUCKET_BYTES if cap is None else cap
    out: List[List[int]] = []
    open_: Dict[Any, Tuple[List[int], int]] = {}  # key -> (the bucket being filled, its bytes)
    for i, (key, nbytes) in enumerate(sizes):
        if nbytes > cap:
            out.append([i])
            continue
        bucket, filled = open_.get(key, (None, 0))
        if bucket is None or filled + nbytes > cap:
            bucket, filled = [], 0
            out.append(bucket)
        bucket.append(i)
        open_[key] = (bucket, filled + nbytes)
    return out


def broadcast_tensors(tensors: Sequence[Any], src: int) -> int:
    """Give every rank rank ``src``'s values of ``tensors`` (written into them in place). Returns the number of
    collectives it took."""
    import torch  # torch: loaded on first use, not on import raytrain_nb
    import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

    plan = buckets([((t.dtype, t.device.type), t.numel() * t.element_size()) for t in tensors])
    mine = dist.get_rank() == src
    for bucket in plan:
        group = [tensors[i] for i in bucket]
        if len(group) == 1 and group[0].is_contiguous():
            dist.broadcast(group[0], src=src)
            continue
        flat = torch.cat([t.reshape(-1) for t in group]) if mine else torch.empty(
            sum(t.numel() for t in group), dtype=group[0].dtype, device=group[0].device)
        dist.broadcast(flat, src=src)
        if not mine:
            offset = 0
            for t in group:
                t.copy_(flat[offset:offset + t.numel()].view_as(t))
                offset += t.numel()
    return len(plan)
