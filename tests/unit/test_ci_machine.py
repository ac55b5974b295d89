""".ci/machine.py, CI's step around `make test`: one line with the time against the budget, also when the venv is
missing (a set-up that failed), and the same line in a file next to the state file."""
from __future__ import annotations

import pathlib
import subprocess
import sys

MACHINE = pathlib.Path(__file__).resolve().parents[2] / ".ci" / "machine.py"


def _machine(cwd: pathlib.Path, *args: str) -> str:
    out = subprocess.run([sys.executable, str(MACHINE), *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_end_says_within_or_over_the_budget_and_writes_the_line_next_to_the_state(tmp_path):
    state = tmp_path / "machine.json"
    assert _machine(tmp_path, "start", str(state)) == ""
    within = _machine(tmp_path, "end", str(state), "--budget", "3600")
    assert within.startswith("CI: make test took ") and "of its 3600 s budget (within)" in within, within
    assert "core-s," in within and "% stolen" in within and "reference loop" in within, within
    assert "import of torch and ray nan core-s" in within, within  # no .venv in that folder: no figure, no failure
    over = _machine(tmp_path, "end", str(state), "--budget", "0")
    assert "of its 0 s budget (OVER)" in over, over
    assert (tmp_path / "machine.txt").read_text() == over + "\n"
