"""Packed broadcasts between two real gloo processes (worker/flat_broadcast.py): every rank ends with rank 0's
values in its own tensors, non-contiguous ones and those over the cap included, in fewer collectives."""
from __future__ import annotations

import pytest
import torch
import torch.multiprocessing as mp

from raytrain_nb._internal.worker import flat_broadcast


def _rank(rank: int, path: str, out: str) -> None:
    import torch.distributed as dist

    torch.manual_seed(rank)  # every rank starts from its own values
    dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
    flat_broadcast.BUCKET_BYTES = 4096  # a small cap: the large tensor goes alone
    model = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2)).double()
    big = torch.randn(2048)  # 8 KiB
    strided = torch.randn(6, 4).t()  # not contiguous
    halves = torch.randn(3, dtype=torch.float16)
    tensors = [*model.state_dict().values(), big, strided, halves]
    with torch.no_grad():
        collectives = flat_broadcast.broadcast_tensors(tensors, src=0)
    torch.save({"tensors": [t.clone() for t in tensors], "collectives": collectives}, f"{out}.{rank}")
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_every_rank_gets_rank_0_s_values_in_place(tmp_path):
    out = str(tmp_path / "result")
    mp.start_processes(_rank, args=(str(tmp_path / "store"), out), nprocs=2, start_method="spawn", join=True)
    zero, one = (torch.load(f"{out}.{r}") for r in (0, 1))
    assert all(torch.equal(a, b) for a, b in zip(zero["tensors"], one["tensors"]))
    torch.manual_seed(1)  # rank 1's own first values differ from what it holds now
    assert not torch.equal(torch.nn.Linear(8, 4).double().weight, one["tensors"][0])
    # 4 double tensors in one bucket, the big float32 alone, the strided float32 in another, the halves in one
    assert zero["collectives"] == one["collectives"] == 4
