"""Figure 14: a Transformers ``Trainer`` through raytrain_nb against the same script under ``torchrun``.

14a: steps/s of ``trainer.train()`` in a ``%%distributed``-style cell on a warm 2-worker group, against the same
code in two ``torchrun`` processes (gloo) that stay up and train on command, interleaved round by round; the
median of the paired ratios with its 95 % interval (target: the interval reaches 0.95). Steps/s are timed
inside training (from the end of step 3 to the last step), so start-up is not in them.
14b: time to the first step of a second ``trainer.train()`` in a later cell (warm) against a fresh
``torchrun`` start of the same script (a new process: imports, process group, model, first step).

The model is the tests' tiny BERT (hidden 32, 1 layer, sequence 16, batch 8), built from a config.
"""
from __future__ import annotations

import json
import os
import tempfile
from typing import Any, Dict, List

from common import (Figure, TorchrunServer, alternate, fmt_stats, loadavg, median_ci, section, stats, timed_group_cell,
                    torchrun_fresh_start)

STEPS = 60
ROUNDS = 10
FRESH = 3

#: The training code both variants run (a cell on the group; the body of the torchrun script).
SHARED = '''
import json, os, sys, time
import torch
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainerCallback, TrainingArguments

class Tokens(torch.utils.data.Dataset):
    def __init__(self, n):
        self.ids = torch.randint(0, 100, (n, 16), generator=torch.Generator().manual_seed(1))
    def __len__(self):
        return len(self.ids)
    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i, 0] % 2}

class StepTimer(TrainerCallback):
    def on_train_begin(self, args, state, control, **kwargs):
        self.times = []
    def on_step_end(self, args, state, control, **kwargs):
        self.times.append(time.time())
    def result(self):
        t = self.times
        return {"first_step": t[0], "steps_per_s": (len(t) - 3) / (t[-1] - t[2])}

def make_trainer(steps):
    torch.manual_seed(0)
    model = BertForSequenceClassification(BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
        num_attention_heads=2, intermediate_size=64, max_position_embeddings=16))
    args = TrainingArguments(output_dir=os.path.join(os.environ.get("TMPDIR", "/tmp"), "bench-hf"),
                             per_device_train_batch_size=8, max_steps=steps, save_strategy="no", logging_steps=10_000,
                             report_to="none", disable_tqdm=True, use_cpu=True, dataloader_pin_memory=False)
    timer = StepTimer()
    return Trainer(model=model, args=args, train_dataset=Tokens(4096), callbacks=[timer]), timer
'''

#: The torchrun script: one training at start (its first step times a fresh start), then one per command file.
SERVER = SHARED + '''
rank, folder, steps = int(os.environ["RANK"]), sys.argv[1], int(sys.argv[2])
trainer, timer = make_trainer(steps)
trainer.train()
def put(name, value):  # whole files only: the driver reads as soon as the name exists
    with open(os.path.join(folder, name + ".tmp"), "w") as fh:
        json.dump(value, fh)
    os.rename(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))
put(f"start-{rank}.json", timer.result())
i = 0
while True:
    cmd = os.path.join(folder, f"cmd-{i}")
    while not os.path.exists(cmd):
        time.sleep(0.01)
    if open(cmd).read() == "stop":
        break
    trainer.train()
    put(f"res-{i}-{rank}.json", timer.result())
    i += 1
'''


def _group_train(group: Any) -> Dict[str, float]:
    return timed_group_cell(group, "trainer.train()\n_r = timer.result()")


def run(quick: bool = False) -> List[Figure]:
    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal.output import CollectSink

    rounds, fresh = (2, 1) if quick else (ROUNDS, FRESH)
    section(f"14. Transformers Trainer: group vs torchrun (2 ranks, gloo; tiny BERT, batch 8, {STEPS} steps a run)")
    tmp = tempfile.mkdtemp(prefix="bench-hf-")
    group = WorkerGroup(2)
    try:
        group.run(SHARED + f"\ntrainer, timer = make_trainer({STEPS})\ntrainer.train()", sink=CollectSink())
        os.makedirs(os.path.join(tmp, "server"))
        baseline = TorchrunServer(SERVER, os.path.join(tmp, "server"), STEPS)
        try:
            samples = alternate({"group": lambda: _group_train(group), "torchrun": baseline.step},
                                rounds=rounds, warmup=1)
        finally:
            baseline.close()
        starts = []
        for i in range(fresh):
            os.makedirs(os.path.join(tmp, f"fresh-{i}"))
            starts.append(torchrun_fresh_start(SERVER, os.path.join(tmp, f"fresh-{i}")))
    finally:
        group.shutdown()
    rates = {name: stats([r["steps_per_s"] for r in runs]) for name, runs in samples.items()}
    for name, s in rates.items():
        print(f"  {name:9s} steps/s: {fmt_stats(s, digits=1)}")
    ratios = [g["steps_per_s"] / t["steps_per_s"] for g, t in zip(samples["group"], samples["torchrun"])]
    r = stats(ratios)
    lo, hi = median_ci(ratios)
    print(f"  ratio group/torchrun: {fmt_stats(r, digits=3)}; 95% CI of median {lo:.3f}-{hi:.3f}; load {loadavg()}")
    warm = stats([g["first_step"] for g in samples["group"]])
    cold = stats(starts)
    print(f"  first step of a later trainer.train() cell (warm): {fmt_stats(warm, digits=2, unit='s')}")
    print(f"  first step of a fresh torchrun start:             {fmt_stats(cold, digits=2, unit='s')}")
    return [
        Figure("14a", "Transformers steps/s group/torchrun (CI upper bound)", hi, "x", ">=", 0.95,
               spread=f"median {r['median']:.3f}, 95% CI {lo:.3f}-{hi:.3f}, IQR {r['q1']:.3f}-{r['q3']:.3f}, n={r['n']}",
               note=f"group {rates['group']['median']:.1f} vs torchrun {rates['torchrun']['median']:.1f} steps/s",
               detail={"ratios": ratios, "group": rates["group"], "torchrun": rates["torchrun"]}),
        Figure("14b", "Transformers first step: warm cell / fresh torchrun", warm["median"] / cold["median"], "x",
               "<", 1.0, spread=f"warm {warm['median']:.2f} s vs fresh {cold['median']:.2f} s (n={cold['n']})",
               detail={"warm_s": warm, "fresh_s": cold}),
    ]


if __name__ == "__main__":
    import argparse

    from common import RESULTS_DIR, single_thread, summary_table

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    single_thread()
    figures = run(quick=parser.parse_args().quick)
    print(summary_table(figures))
    os.makedirs(RESULTS_DIR, exist_ok=True)
    with open(os.path.join(RESULTS_DIR, "transformers.json"), "w") as fh:
        json.dump([f.as_dict() for f in figures], fh, indent=1, default=str)
