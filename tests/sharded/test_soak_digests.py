"""The soak's three ways to digest a sharded (FSDP2) model give one digest: gathered with ``full_tensor()`` on every
rank, joined by the soak from every rank's local shard, and gathered by DCP from a snapshot's ``sharded/`` folder.

Three gloo processes of torch alone (no Ray): an MLP sharded as ``prepare_model(..., "fsdp2")`` shards it,
trained with AdamW, its state written as the product's snapshots write it.
"""
from __future__ import annotations

import os
import pickle
import sys
from typing import Any, Dict

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rank(rank: int, world: int, folder: str) -> None:
    """One rank: build, train, digest each way, write the snapshot's sharded part; its results to a file."""
    sys.path.insert(0, ROOT)
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from raytrain_nb._internal.worker import sharded_io
    from raytrain_nb._internal.worker.snapshot import find_tracked
    from soak import digest

    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank, world_size=world)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    mesh = init_device_mesh("cpu", (world,))
    for child in (model[0], model[2]):  # prepare_model's policy: each child holding parameters, then the root
        fully_shard(child, mesh=mesh)
    fully_shard(model, mesh=mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(2):
        loss = model(torch.randn(16, 16)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
    ns = {"model": model, "opt": opt, "ballast": torch.nn.Linear(4, 4), "step": 2}
    gathered = digest.soak_digests(ns, gather=True)
    state = digest.soak_state(ns, gather=True)
    dcp.save(sharded_io.state_of(find_tracked(ns, strict=False), copy=True),
             storage_writer=dcp.FileSystemWriter(os.path.join(folder, "snap", "sharded")))
    with open(os.path.join(folder, f"rank{rank}.pkl"), "wb") as fh:
        pickle.dump({"gathered": gathered, "parts": digest.soak_parts(ns),
                     "state": {p: digest.soak_digest(sd) for p, sd in state.items()}}, fh)
    dist.destroy_process_group()


def test_gathered_joined_and_dcp_digests_of_a_sharded_model_agree(tmp_path: Any) -> None:
    import torch.multiprocessing as mp

    world = 3  # uneven shards: 8 rows as 3, 3, 2; the head's 1 row as 1, 0, 0

    from soak import digest
    from soak.ledger import compare_ranks, sharded_digests

    mp.start_processes(_rank, args=(world, str(tmp_path)), nprocs=world, start_method="spawn")
    ranks = []
    for r in range(world):
        with open(tmp_path / f"rank{r}.pkl", "rb") as fh:
            ranks.append(pickle.load(fh))
    gathered: Dict[str, str] = ranks[0]["gathered"]
    assert all(r["gathered"] == gathered for r in ranks)
    assert all(isinstance(r["parts"]["model"], dict) and isinstance(r["parts"]["opt"], dict) for r in ranks)
    merged = digest.soak_merge([r["parts"] for r in ranks])
    assert merged == [gathered] * world and compare_ranks(merged) == ([], [])
    assert ranks[0]["state"] == {p: d for p, d in gathered.items() if p != "ballast"}  # a reported checkpoint's
    assert sharded_digests(str(tmp_path / "snap")) == {gathered["model"], gathered["opt"]}
