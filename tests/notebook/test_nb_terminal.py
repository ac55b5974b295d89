"""The text fallback in a plain terminal IPython (no Jupyter kernel, so no widgets), and pdb on a rank there."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = [pytest.mark.notebook, pytest.mark.scripts]  # a terminal IPython session of its own

SCRIPT = '''\
%load_ext raytrain_nb
get_ipython().run_cell_magic("distributed", "--workers 2", "import raytrain_nb as train")
get_ipython().run_cell_magic("distributed", "--steps 6", "import time\\nfor step in range(6):\\n    train.report({'step': step, 'loss': 0.5})\\n    time.sleep(0.6)")
%dist_dashboard
get_ipython().run_cell_magic("distributed", "", "if train.get_context().get_world_rank() == 1:\\n    breakpoint()\\nq = 5")
%dist_shutdown
'''


def test_terminal_ipython_gets_one_status_line_per_report(tmp_path):
    script = tmp_path / "train.ipy"
    script.write_text(SCRIPT)
    env = dict(os.environ, RAYTRAIN_NB_NUM_CPUS="8", OMP_NUM_THREADS="1", RAYTRAIN_NB_UI="auto")
    proc = subprocess.run([sys.executable, "-m", "IPython", "--no-banner", "--colors=nocolor", str(script)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                          input="p 6 * 7\nc\n")  # rank 1's pdb prompt reads the terminal
    out = proc.stdout
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "application/vnd.jupyter.widget-view+json" not in out and "VBox" not in out
    for rank in (0, 1):
        assert f"raytrain_nb [rank {rank}]  6/6" in out, out
        assert f"raytrain_nb [rank {rank}]  1/6" in out, out
    assert "a status line follows each report" in out  # %dist_dashboard in a terminal
    assert "rank  node" in out  # ... with the status table
    assert out.count("shut down") == 1
    assert out.count("[rank 1] (Pdb) ") == 2 and "42\n" in out, out  # breakpoint() works in a terminal too
