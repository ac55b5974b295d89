"""Local mode under ``torchrun``: every process runs the training function, in one process group (as Ray Train)."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent("""
    import os
    import torch
    import torch.distributed as dist
    import raytrain_nb as train
    from raytrain_nb import ScalingConfig
    from raytrain_nb.torch import TorchTrainer, prepare_model


    def train_func(config):
        ctx = train.get_context()
        model = prepare_model(torch.nn.Linear(2, 1))
        total = torch.tensor([float(ctx.get_world_rank() + 1)])
        dist.all_reduce(total)  # the processes torchrun started are one group
        train.report({"total": total.item()})
        return type(model).__name__, ctx.get_world_rank(), ctx.get_world_size(), ctx.get_local_rank()


    result = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=0)).fit()
    # one write of one whole line: both processes share the pipe, and print's pieces of two lines can interleave
    line = " ".join(map(str, ["RESULT", *result.return_value, result.metrics["total"], dist.is_initialized(),
                              result.path]))
    os.write(1, (line + "\\n").encode())
""")


@pytest.mark.scripts
@pytest.mark.timeout(300)
def test_under_torchrun_each_process_runs_the_function_in_one_process_group_and_leaves_none(tmp_path):
    script = tmp_path / "script.py"
    script.write_text(SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                           str(script)], capture_output=True, text=True, timeout=280, env=env, cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    lines = sorted(line for line in proc.stdout.splitlines() if line.startswith("RESULT"))
    assert lines == [f"RESULT DistributedDataParallel {rank} 2 {rank} 3.0 False None" for rank in (0, 1)], proc.stdout
