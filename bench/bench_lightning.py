"""Figure 15: Lightning ``Trainer.fit`` through raytrain_nb against the same code under ``torchrun``.

15a: steps/s of ``trainer.fit`` in a ``%%distributed``-style cell on a warm 2-worker group (``RayDDPStrategy``),
against the same code in two ``torchrun`` processes (gloo, Lightning's own ``DDPStrategy``) that stay up and fit
on command, interleaved round by round; the median of the paired ratios with its 95 % interval (target: the
interval reaches 0.95). Steps/s are timed inside training (from the end of step 3 to the last step), so the fit's
start-up is not in them. Each round is a new ``Trainer`` fitting the same warm module, as a later cell does.
15b: time to the first step of a second ``fit`` in a later cell (warm group) against a fresh ``torchrun`` start
of the same script (a new process: imports, process group, model, Trainer, first step).
15c (diagnostic): the same ratio against ``torchrun`` at the niceness Ray gives its workers (15), a control
for CPU taken by other work on a shared machine.

The model is an MLP 64-256-256-10, batch 64, SGD, on fixed generated data.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List

from common import (Figure, TorchrunServer, alternate, fmt_stats, loadavg, median_ci, section, stats, timed_group_cell,
                    torchrun_fresh_start)

STEPS = 150
ROUNDS = 10
FRESH = 3

#: The training code both variants run (a cell on the group; the body of the torchrun script).
SHARED = '''
import os, time
import torch, lightning.pytorch as pl
torch.set_num_threads(1)

class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                       torch.nn.ReLU(), torch.nn.Linear(256, 10))
    def training_step(self, batch, i):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)
    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

class StepTimer(pl.Callback):
    def on_train_start(self, trainer, pl_module):
        self.times = []
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.times.append(time.time())
    def result(self):
        t = self.times
        return {"first_step": t[0], "steps_per_s": (len(t) - 3) / (t[-1] - t[2])}

def make_loader(steps, world=2):
    g = torch.Generator().manual_seed(1)
    n = 64 * steps * world
    data = torch.utils.data.TensorDataset(torch.randn(n, 64, generator=g), torch.randint(0, 10, (n,), generator=g))
    return torch.utils.data.DataLoader(data, batch_size=64)

def make_trainer(timer, **strategy):
    return pl.Trainer(max_epochs=1, accelerator="cpu", logger=False, enable_progress_bar=False,
                      enable_model_summary=False, enable_checkpointing=False, callbacks=[timer], **strategy)

torch.manual_seed(0)
model = Net()
timer = StepTimer()
'''

GROUP = SHARED + '''
from raytrain_nb.lightning import RayDDPStrategy, RayLightningEnvironment, prepare_trainer
def ray_ddp():  # a strategy object serves one Trainer: a new one for each
    return dict(strategy=RayDDPStrategy(), plugins=[RayLightningEnvironment()], devices="auto")
'''

#: One fit on the group (a later notebook cell).
GROUP_FIT = "trainer = prepare_trainer(make_trainer(timer, **ray_ddp()))\ntrainer.fit(model, loader)\n_r = timer.result()"

#: The torchrun script: one fit at start (its first step times a fresh start), then one per command file.
SERVER = SHARED + '''
import json, sys
rank, folder, steps = int(os.environ["RANK"]), sys.argv[1], int(sys.argv[2])
loader = make_loader(steps)
def fit():
    make_trainer(timer, strategy="ddp", devices=2).fit(model, loader)
    return timer.result()
def write(name, value):
    with open(os.path.join(folder, name + ".tmp"), "w") as fh:
        json.dump(value, fh)
    os.rename(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))
write(f"start-{rank}.json", fit())
i = 0
while True:
    cmd = os.path.join(folder, f"cmd-{i}")
    while not os.path.exists(cmd):
        time.sleep(0.01)
    if open(cmd).read() == "stop":
        break
    write(f"res-{i}-{rank}.json", fit())
    i += 1
'''


def _worker_niceness(group: Any) -> int:
    import psutil

    try:
        return psutil.Process(group.slots[0].info["pid"]).nice()
    except Exception:  # noqa: BLE001 - a remote worker: not visible from here
        return 0


def _group_fit(group: Any) -> Dict[str, float]:
    return timed_group_cell(group, GROUP_FIT)


def run(quick: bool = False) -> List[Figure]:
    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal.output import CollectSink

    rounds, fresh = (2, 1) if quick else (ROUNDS, FRESH)
    section(f"15. Lightning fit: group vs torchrun (2 ranks, gloo; MLP 64-256-256-10, batch 64, {STEPS} steps a fit)")
    tmp = tempfile.mkdtemp(prefix="bench-lightning-")
    group = WorkerGroup(2)
    try:
        group.run(GROUP + f"\nloader = make_loader({STEPS})\n" + GROUP_FIT, sink=CollectSink())
        nice = _worker_niceness(group)
        os.makedirs(os.path.join(tmp, "server"))
        baseline = TorchrunServer(SERVER, os.path.join(tmp, "server"), STEPS)
        variants = {"group": lambda: _group_fit(group), "torchrun": baseline.step}
        niced = None
        if nice:  # Ray runs its workers niced: a control with torchrun at the same niceness
            print(f"  the group's workers run at niceness {nice}; torchrun runs at 0 (as a user runs it) and, as a "
                  f"control, at {nice}")
            os.makedirs(os.path.join(tmp, "niced"))
            niced = TorchrunServer(SERVER, os.path.join(tmp, "niced"), STEPS, nice=nice)
            variants["torchrun@nice"] = niced.step
        try:
            samples = alternate(variants, rounds=rounds, warmup=1)
        finally:
            baseline.close()
            if niced is not None:
                niced.close()
        starts = []
        for i in range(fresh):
            os.makedirs(os.path.join(tmp, f"fresh-{i}"))
            starts.append(torchrun_fresh_start(SERVER, os.path.join(tmp, f"fresh-{i}")))
    finally:
        group.shutdown()
    rates = {name: stats([r["steps_per_s"] for r in runs]) for name, runs in samples.items()}
    for name, s in rates.items():
        print(f"  {name:9s} steps/s: {fmt_stats(s, digits=1)}")
    def paired(other: str) -> Dict[str, Any]:
        xs = [g["steps_per_s"] / t["steps_per_s"] for g, t in zip(samples["group"], samples[other])]
        return {"ratios": xs, "stats": stats(xs), "ci95": median_ci(xs)}

    main = paired("torchrun")
    r, (lo, hi), ratios = main["stats"], main["ci95"], main["ratios"]
    print(f"  ratio group/torchrun: {fmt_stats(r, digits=3)}; 95% CI of median {lo:.3f}-{hi:.3f}; load {loadavg()}")
    control = paired("torchrun@nice") if "torchrun@nice" in samples else None
    if control is not None:
        print(f"  ratio group/torchrun@nice: {fmt_stats(control['stats'], digits=3)}; 95% CI of median "
              f"{control['ci95'][0]:.3f}-{control['ci95'][1]:.3f}")
    warm = stats([g["first_step"] for g in samples["group"]])
    cold = stats(starts)
    print(f"  first step of a later fit cell (warm):  {fmt_stats(warm, digits=2, unit='s')}")
    print(f"  first step of a fresh torchrun start:   {fmt_stats(cold, digits=2, unit='s')}")
    figures = [
        Figure("15a", "Lightning steps/s group/torchrun (CI upper bound)", hi, "x", ">=", 0.95,
               spread=f"median {r['median']:.3f}, 95% CI {lo:.3f}-{hi:.3f}, IQR {r['q1']:.3f}-{r['q3']:.3f}, n={r['n']}",
               note=f"group {rates['group']['median']:.1f} vs torchrun {rates['torchrun']['median']:.1f} steps/s",
               detail={"ratios": ratios, "group": rates["group"], "torchrun": rates["torchrun"]}),
        Figure("15b", "Lightning first step: warm cell / fresh torchrun", warm["median"] / cold["median"], "x",
               "<", 1.0, spread=f"warm {warm['median']:.2f} s vs fresh {cold['median']:.2f} s (n={cold['n']})",
               detail={"warm_s": warm, "fresh_s": cold}),
    ]
    if control is not None:
        c = control["stats"]
        figures.append(Figure(
            "15c", f"control: Lightning group/torchrun both at niceness {nice} (CI upper bound)", control["ci95"][1],
            "x", "info", 0.95, spread=f"median {c['median']:.3f}, 95% CI {control['ci95'][0]:.3f}-"
            f"{control['ci95'][1]:.3f}, n={c['n']}", note=f"torchrun@nice {rates['torchrun@nice']['median']:.1f} steps/s",
            detail=control))
    return figures


if __name__ == "__main__":
    import argparse

    from common import RESULTS_DIR, single_thread, summary_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    single_thread()
    figures = run(quick=parser.parse_args().quick)
    print(summary_table(figures))
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, "lightning.json"), "w") as fh:
        json.dump([f.as_dict() for f in figures], fh, indent=1, default=str)
