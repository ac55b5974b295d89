"""The soak's kernel driver loads the suite's kernel helper as ``make soak`` starts it (a fresh interpreter in the
repository's root): a change to tests/notebook/nbkernel.py's imports once stopped CI's soak step at its first kernel
episode, after the whole suite had passed."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

PROBE = """
from soak.driver_kernel import _nbkernel
module = _nbkernel()
print(module.__name__, callable(module.Kernel), callable(module.Kernel.hand_on), callable(module.wait_for))
"""


def test_the_soak_loads_the_kernel_helper_in_a_fresh_interpreter():
    proc = subprocess.run([sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split() == ["tests.notebook.nbkernel", "True", "True", "True"], proc.stdout
