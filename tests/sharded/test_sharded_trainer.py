"""Ray Train's FSDP2 guide in a trainer (examples/torch_fsdp2.py, imports swapped): each rank saves DCP into a
directory it reports with Checkpoint.from_directory, one checkpoint holds every rank's shard files and DCP's
metadata, and the run at 3 workers resumes from the one written by 2 with the same full parameters."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from ..integration.test_examples import ROOT, port


@pytest.mark.timeout(600)
def test_the_fsdp2_guide_commits_every_ranks_shards_and_resumes_at_another_world_size(tmp_path):
    path = tmp_path / "torch_fsdp2.py"
    path.write_text(port((ROOT / "examples" / "torch_fsdp2.py").read_text()))
    assert "ray.train" not in path.read_text().split('"""', 2)[2]
    env = {**os.environ, "RAYTRAIN_NB_STORAGE_PATH": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(path)], capture_output=True, text=True, timeout=580, env=env,
                          cwd=tmp_path)
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-5000:])
    assert "RESUMED AT 3 RANKS FROM EPOCH 1" in proc.stdout and "FSDP2 GUIDE OK" in proc.stdout
