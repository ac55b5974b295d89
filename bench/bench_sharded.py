"""Section 24: sharded (FSDP2) models (``python bench/bench_sharded.py [--quick]``).

One group, a generated model of ``BLOCKS`` square linear layers (``WIDTH``: 12 x 2048^2 fp32 = 201 MB of parameters;
``--quick``: 12 x 512^2 = 12.6 MB), AdamW, CPU and gloo:

24a. Per-rank bytes of parameters + gradients + optimizer state at 1, 2 and 4 ranks (what each rank holds: local
     shards; should fall about as 1/N). Diagnostic.
24b. Steps/s of FSDP2 vs DDP of the same model at 2 ranks. Diagnostic (gloo on 2 shared cores).
24c. Snapshot and rollback time of the FSDP2 model vs DDP's snapshot / rollback of the same model, at 2 ranks.
24d. The buddy mirror's cost per training cell (bytes copied, seconds), at 2 ranks.
24e. Restart after a kill, and rescale 2 -> 4 -> 2 (re-sharding from the mirrors), seconds.

The machine is shared and loaded: each figure is printed with the load average beside it.
"""
from __future__ import annotations

import os
import signal
import sys
import time
from typing import List

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import Figure, loadavg, run_standalone, section, single_thread  # noqa: E402

BUILD = """
import time, torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self, width, blocks):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(width, width, bias=False) for _ in range(blocks)])
    def forward(self, x):
        for b in self.blocks:
            x = torch.tanh(b(x))
        return x
model = prepare_model(Net({width}, {blocks}), parallel_strategy={strategy!r})
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
def step():
    loss = model(torch.randn(8, {width})).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
def held():
    local = lambda t: getattr(t, "_local_tensor", t)
    n = lambda t: local(t).numel() * local(t).element_size()
    params = sum(n(p) for p in model.parameters())
    grads = sum(n(p.grad) for p in model.parameters() if p.grad is not None)
    states = sum(n(v) for s in opt.state.values() for v in s.values() if hasattr(v, "numel"))
    return params + grads + states
"""


def _quiet(group, source):
    from raytrain_nb._internal.output import CollectSink

    return group.run(source, sink=CollectSink())


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def run(quick: bool = False) -> List[Figure]:
    single_thread()
    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal import cluster

    width, blocks = (512, 12) if quick else (2048, 12)
    steps = 3 if quick else 2
    mb = width * width * blocks * 4 / 2**20
    section(f"24. sharded models: {blocks} x {width}^2 fp32 = {mb:.0f} MiB of parameters, AdamW")
    cluster.connect()
    figures: List[Figure] = []
    storage = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"rtnb-bench-sharded-{os.getpid()}")

    def fig(key, label, value, unit):
        f = Figure(key, f"{label} [load {loadavg()}]", value, unit, "info", 0.0)
        print(f"  {key}: {label} = {value:.3f} {unit}   (load average {loadavg()})", flush=True)
        figures.append(f)

    per = {}
    for strategy in ("ddp", "fsdp2"):
        # half a CPU each: a rescale to 4 fits this 2-CPU machine
        group = WorkerGroup(2, cpus_per_worker=0.5, storage_path=storage, name=f"bench-{strategy}-{os.getpid()}")
        try:
            _quiet(group, BUILD.format(width=width, blocks=blocks, strategy=strategy))
            _quiet(group, "step()")  # warm: optimizer state made
            if strategy == "fsdp2":
                group.mirror_shards(False)  # the steps alone; the mirror's cost is 24d
            t = _timed(lambda: _quiet(group, f"for _ in range({steps}): step()"))
            per[strategy] = steps / t
            fig(f"24b-{strategy}", f"{strategy} steps/s at 2 ranks (one cell of {steps} steps)", steps / t, "steps/s")
            if strategy == "fsdp2":
                group.mirror_shards(True)
            t_snap = _timed(lambda: group.checkpoint(name="bench"))
            t_roll = _timed(lambda: group.rollback("bench"))
            fig(f"24c-{strategy}-snap", f"{strategy} snapshot at 2 ranks", t_snap, "s")
            fig(f"24c-{strategy}-roll", f"{strategy} rollback at 2 ranks", t_roll, "s")
            if strategy == "ddp":
                continue
            _quiet(group, "step()")  # a cell that trained: mirrored at its end
            mirrors = group._core.mirrors  # noqa: SLF001 - the bench reads what the group measured
            fig("24d-bytes", "mirror bytes per training cell (all ranks)", mirrors.last_bytes / 2**20, "MiB")
            fig("24d-s", "mirror seconds per training cell", mirrors.last_s, "s")
            for n in (2,):
                _quiet(group, "_held = held()")
                fig(f"24a-{n}", f"per-rank params+grads+optimizer at {n} ranks",
                    max(group.pull("_held", rank=None)) / 2**20, "MiB")
            pid = group.status()[1].pid
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + 60
            while group.status()[1].state != "dead" and time.monotonic() < deadline:
                time.sleep(0.1)
            fig("24e-restart", "restart after a kill (from the buddy's mirror)", _timed(group.restart), "s")
            fig("24e-to4", "rescale 2 -> 4", _timed(lambda: group.rescale(4)), "s")
            _quiet(group, "step(); _held = held()")
            fig("24a-4", "per-rank params+grads+optimizer at 4 ranks", max(group.pull("_held", rank=None)) / 2**20,
                "MiB")
            fig("24e-to2", "rescale 4 -> 2", _timed(lambda: group.rescale(2)), "s")
            group.rescale(1)
            _quiet(group, "step(); _held = held()")
            fig("24a-1", "per-rank params+grads+optimizer at 1 rank", group.pull("_held", rank=0) / 2**20, "MiB")
        finally:
            group.shutdown()
    if per.get("ddp"):
        fig("24b-ratio", "fsdp2 / ddp steps/s at 2 ranks", per["fsdp2"] / per["ddp"], "x")
    return figures


if __name__ == "__main__":
    sys.exit(run_standalone(run, __doc__, "bench_sharded", "a 12.6 MB model instead of 201 MB"))
