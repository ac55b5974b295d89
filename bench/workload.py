"""The fixed training workload, as cell source shared by the group and the plain-torch baseline.

Both sides exec the *same* source text in a namespace dict (module-level semantics, like a
notebook cell), so a difference in steps/s comes from the framework around the loop, never
from the loop. The baseline runs it in ``torch.multiprocessing.spawn`` processes that stay up
between measurements and take cell sources from a queue.
"""
from __future__ import annotations

import os
import time
from typing import Any, Dict

# Model: 64 -> 256 -> 256 -> 10 MLP, batch 64, SGD; fixed data per rank.
MODEL_SRC = """
import time
import torch, torch.nn as nn, torch.nn.functional as F
import torch.distributed as dist
torch.set_num_threads(1)
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10))
_gen = torch.Generator().manual_seed(1 + rank)
X = torch.randn(64, 64, generator=_gen)
Y = torch.randint(0, 10, (64,), generator=_gen)
"""

GROUP_SETUP = """
import raytrain_nb as train
from raytrain_nb.torch import prepare_model
rank = train.get_context().get_world_rank()
""" + MODEL_SRC + """
model = prepare_model(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
"""

BASELINE_SETUP = MODEL_SRC + """
from torch.nn.parallel import DistributedDataParallel as DDP
model = DDP(net)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
"""

_LOOP = """
dist.barrier()
_c0 = time.process_time()
_t0 = time.perf_counter()
for _i in range({steps}):
    opt.zero_grad(set_to_none=True)
    loss = F.cross_entropy(model(X), Y)
    loss.backward()
    opt.step()
{extra}elapsed = time.perf_counter() - _t0
cpu_time = time.process_time() - _c0
"""


def loop_cell(steps: int, report: bool = False, body: str = "") -> str:
    """A cell that trains ``steps`` DDP steps; it leaves the loop's wall time in ``elapsed`` and the
    CPU time its process spent meanwhile (every thread: Ray's and gloo's too) in ``cpu_time``. ``body``: more lines
    of the loop's body after each step (indented by four spaces, ending in a newline)."""
    extra = "    train.report({'loss': loss.item(), 'step': _i})\n" if report else ""
    return _LOOP.format(steps=int(steps), extra=extra + body)


# Both ranks run the forward (DDP may hold a collective there: its bucket rebuild after the first
# backward); then rank 1 spins in Python while rank 0 blocks in the allreduce of DDP's backward.
BLOCKED_CELL = """
loss = F.cross_entropy(model(X), Y)
if rank == 1:
    while True:
        pass
loss.backward()
"""

# Both ranks run the forward; rank 1 raises, rank 0 waits in DDP's backward for a peer that never comes.
DIVERGENT_CELL = """
loss = F.cross_entropy(model(X), Y)
if rank == 1:
    raise ValueError("divergent rank")
loss.backward()
"""

# One full step on every rank, returning a checksum of the parameters (equal on all ranks).
CHECK_STEP_CELL = """
opt.zero_grad(set_to_none=True)
loss = F.cross_entropy(model(X), Y)
loss.backward()
opt.step()
checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
"""


def baseline_child(rank: int, world: int, port: int, commands: Any, results: Any, nice: int = 0) -> None:
    """A plain torch.distributed process (gloo): run cell sources from ``commands[rank]``.

    ``nice`` raises this process's niceness (Ray starts its workers at niceness 15).
    """
    os.environ["OMP_NUM_THREADS"] = "1"
    if nice:
        os.nice(nice)
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    ns: Dict[str, Any] = {"__name__": "__main__", "rank": rank}
    exec(compile(BASELINE_SETUP, "<baseline-setup>", "exec"), ns)
    queue = commands[rank]
    while True:
        source = queue.get()
        if source is None:
            break
        t0 = time.perf_counter()
        exec(compile(source, "<baseline-cell>", "exec"), ns)
        results.put((rank, ns.get("elapsed"), time.perf_counter() - t0, ns.get("cpu_time")))
    dist.destroy_process_group()
