"""The GPU path on a machine with one NVIDIA GPU, as one script: ``python bench/gpu_check.py [OUT.json]``.

A group of one worker with ``gpus_per_worker=1`` (``%%distributed --workers 1 --gpus 1``): the worker's device is
``cuda`` and its process group ``nccl``; a sharded (FSDP2) model and a DDP model each train there, a snapshot and a
rollback bring their state back exactly, and after the worker is SIGKILLed a restart from the snapshot brings it back
on a fresh worker. Prints one JSON object of what ran and the timings (and writes it to OUT.json if given); exits 1
if any check failed. Ray and raytrain_nb must be importable; nothing is downloaded.
"""
from __future__ import annotations

import json
import os
import signal
import sys
import tempfile
import time

BUILD = """
import torch, torch.distributed as dist, raytrain_nb as train
from raytrain_nb.torch import prepare_model, get_device
torch.manual_seed(0)
net = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.ReLU(), torch.nn.Linear(512, 8))
model = prepare_model(net{kwargs})
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
def train_steps(n):
    for _ in range(n):
        loss = model(torch.randn(64, 256, device=get_device())).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
def full():
    sd = model.state_dict()
    return {{k: (v.full_tensor() if hasattr(v, 'full_tensor') else v).detach().cpu().clone() for k, v in sd.items()}}
def where():
    p = next(iter(model.parameters()))
    return {{"device": str(get_device()), "backend": dist.get_backend(), "param_device": str(p.device),
             "param_type": type(p).__name__, "mesh": str(getattr(p, "device_mesh", None))}}
"""


def same(a, b) -> bool:
    import torch

    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def round_trip(name: str, kwargs: str, storage: str, gpus: int) -> dict:
    from raytrain_nb import WorkerGroup

    res: dict = {}
    t = time.perf_counter()
    group = WorkerGroup(1, gpus_per_worker=gpus, storage_path=storage, name=name)
    res["start_s"] = round(time.perf_counter() - t, 2)
    try:
        group.run(BUILD.format(kwargs=kwargs), output="none")
        group.run("train_steps(3)\n_w = where()", output="none")
        res["where"] = group.pull("_w")
        group.run("_f = full()", output="none")
        before = group.pull("_f")
        t = time.perf_counter()
        entry = group.checkpoint()
        res["snapshot_s"] = round(time.perf_counter() - t, 3)
        group.run("train_steps(3)\n_f = full()", output="none")
        res["trained_after_snapshot_changed"] = not same(before, group.pull("_f"))
        t = time.perf_counter()
        group.rollback()
        res["rollback_s"] = round(time.perf_counter() - t, 3)
        group.run("_f = full()", output="none")
        res["rollback_exact"] = same(before, group.pull("_f"))
        os.kill(group.status()[0].pid, signal.SIGKILL)
        time.sleep(1.0)  # the monitor marks it dead; restart pings first anyway
        t = time.perf_counter()
        group.restart(from_checkpoint=entry.name if entry is not None else "latest")
        res["restart_from_snapshot_s"] = round(time.perf_counter() - t, 2)
        group.run("_f = full()\n_w = where()", output="none")
        res["restart_exact"] = same(before, group.pull("_f"))
        res["where_after_restart"] = group.pull("_w")
        group.run("train_steps(2)", output="none")
        res["trains_after_restart"] = True
    except Exception as exc:  # noqa: BLE001 - reported in the JSON, the run goes on to the next check
        res["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    finally:
        group.shutdown()
    return res


def main() -> int:
    import ray
    import torch

    out: dict = {"torch": torch.__version__, "cuda": torch.cuda.is_available(),
                 "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    t = time.perf_counter()
    gpus = 1 if out["cuda"] else 0  # without a GPU: a dry run of the same steps on CPU (gloo)
    ray.init(num_cpus=4, num_gpus=gpus, include_dashboard=False, object_store_memory=2**30)
    out["ray_init_s"] = round(time.perf_counter() - t, 2)
    storage = tempfile.mkdtemp(prefix="gpu-check-")
    out["fsdp2"] = round_trip("gpu-fsdp2", ', parallel_strategy="fsdp2"', storage, gpus)
    out["ddp"] = round_trip("gpu-ddp", "", storage, gpus)
    ok = all(r.get(k) is True for r in (out["fsdp2"], out["ddp"])
             for k in ("rollback_exact", "restart_exact", "trains_after_restart"))
    backend = "nccl" if gpus else "gloo"
    ok = ok and all(r.get("where", {}).get("backend") == backend for r in (out["fsdp2"], out["ddp"]))
    out["ok"] = ok
    text = json.dumps(out, indent=1, default=str)
    print(text)
    if len(sys.argv) > 1:
        with open(sys.argv[1], "w") as f:
            f.write(text)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
