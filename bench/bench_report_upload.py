"""Figures 22a-22d: what a reported checkpoint costs the training loop, SYNC vs ASYNC upload.

22a (info) / 22b: how long one ``report()`` of a 200 MB checkpoint (rank 0's files; rank 1 a small one) blocks the
training loop, SYNC (the upload is done when it returns) vs ASYNC (it returns at once and uploads in the
background), interleaved on the same 2-worker group; 22b's target: ASYNC blocks under 5 % of SYNC's time (it copies
nothing before returning). 22c: steps/s of the DDP loop saving and reporting an ASYNC checkpoint every 50 steps vs
never, interleaved (A B A B), the slowdown at the worse end of the 95 % interval of the median ratio; target within
10 % (the saving itself, ``torch.save`` of the model into a temporary directory, is the loop's own cost and counted).
22d (info): the same ratio in steps per CPU second of the busier worker.
"""
from __future__ import annotations

import statistics
import tempfile
from typing import Any, Dict, List

from common import Figure, alternate, fmt_stats, median_ci, section, stats
from workload import loop_cell

MB = 200
ROUNDS = 5
STEPS = 600
EVERY = 50

BLOCKED = """
import os, tempfile, time
_d = tempfile.mkdtemp()
with open(os.path.join(_d, f"blob-{{rank}}.bin"), "wb") as _f:
    _f.write(os.urandom(1 << 20) * ({mb} if rank == 0 else 1))
_t0 = time.perf_counter()
train.report({{"x": 1}}, checkpoint=train.Checkpoint.from_directory(_d),
             checkpoint_upload_mode=train.CheckpointUploadMode.{mode})
blocked = time.perf_counter() - _t0
if "{mode}" == "SYNC":  # ASYNC deletes it once uploaded
    import shutil
    shutil.rmtree(_d, ignore_errors=True)
"""

#: After every ``{every}``-th step of workload.loop_cell's DDP loop: a checkpoint reported ASYNC (rank 0's weights).
ASYNC_EVERY = """\
    if (_i + 1) % {every} == 0:
        _d = tempfile.mkdtemp()
        if rank == 0:
            torch.save(model.module.state_dict(), os.path.join(_d, "model.pt"))
        train.report({{"loss": loss.item(), "step": _i}}, checkpoint=train.Checkpoint.from_directory(_d),
                     checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC)
"""


def loop(steps: int, every: int) -> str:
    """The DDP loop of ``steps`` steps, reporting an ASYNC checkpoint every ``every`` steps (0: never)."""
    return "import os, tempfile\n" + loop_cell(steps, body=ASYNC_EVERY.format(every=every) if every else "")


def run(quick: bool = False) -> List[Figure]:
    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal import cluster
    from raytrain_nb._internal.output import CollectSink
    from workload import GROUP_SETUP

    section(f"22. reported checkpoints: a {MB} MB report's blocked time SYNC vs ASYNC; steps/s with an ASYNC "
            f"checkpoint every {EVERY} steps vs never")
    rounds, steps = (2, 200) if quick else (ROUNDS, STEPS)
    cluster.connect()
    group = WorkerGroup(2, storage_path=tempfile.mkdtemp(prefix="rtnb-bench-upload-"), num_to_keep=1)
    try:
        group.run(GROUP_SETUP, sink=CollectSink())

        def blocked(mode: str) -> float:
            group.run(BLOCKED.format(mb=MB, mode=mode), sink=CollectSink())
            return float(group.pull("blocked", rank=0))

        times = alternate({"SYNC": lambda: blocked("SYNC"), "ASYNC": lambda: blocked("ASYNC")}, rounds)
        sync, asynch = stats(times["SYNC"]), stats(times["ASYNC"])
        print(f"  SYNC  report of {MB} MB blocks the loop {fmt_stats(sync, 1e3, 'ms')}")
        print(f"  ASYNC report of {MB} MB blocks the loop {fmt_stats(asynch, 1e3, 'ms')}")

        def measure(every: int) -> Dict[str, float]:
            group.run(loop(steps, every), sink=CollectSink())
            return {"steps_per_s": steps / max(group.pull("elapsed", rank=None)),
                    "steps_per_cpu_s": steps / max(group.pull("cpu_time", rank=None))}

        runs = alternate({"never": lambda: measure(0), "async": lambda: measure(EVERY)}, rounds * 2)
        ratios = [a["steps_per_s"] / n["steps_per_s"] for a, n in zip(runs["async"], runs["never"])]
        cpu_ratios = [a["steps_per_cpu_s"] / n["steps_per_cpu_s"] for a, n in zip(runs["async"], runs["never"])]
        low, high = median_ci(ratios)
        print(f"  steps/s never {fmt_stats(stats([r['steps_per_s'] for r in runs['never']]))}, ASYNC every {EVERY} "
              f"{fmt_stats(stats([r['steps_per_s'] for r in runs['async']]))}; ratio median "
              f"{statistics.median(ratios):.3f} (95 % interval {low:.3f}-{high:.3f})")
    finally:
        group.shutdown()
    share = asynch["median"] / sync["median"] if sync["median"] else None
    return [
        Figure("22a", f"report() of a {MB} MB checkpoint, SYNC: loop blocked", sync["median"] * 1e3, "ms", "info",
               0.0, spread=fmt_stats(sync, 1e3, "ms")),
        Figure("22b", f"ASYNC blocked time / SYNC's ({MB} MB)", None if share is None else 100 * share, "%", "<",
               5.0, spread=fmt_stats(asynch, 1e3, "ms")),
        Figure("22c", f"slowdown, ASYNC checkpoint every {EVERY} steps vs never (worse end of 95 % CI)",
               100 * (1 - low), "%", "<", 10.0, spread=f"median ratio {statistics.median(ratios):.3f}"),
        Figure("22d", "the same in steps per worker CPU second (median ratio)", statistics.median(cpu_ratios), "x",
               "info", 1.0),
    ]


def main() -> int:
    from common import run_standalone

    return run_standalone(run, __doc__, "report_upload", "fewer rounds and steps (a smoke run)")


if __name__ == "__main__":
    import sys

    sys.exit(main())
