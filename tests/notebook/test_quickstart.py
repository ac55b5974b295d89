"""The quickstart notebook, run end to end the way ``make demo`` runs it (nbclient, a real kernel)."""
from __future__ import annotations

import datetime
import pathlib
import re
import subprocess
import sys

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_notebook

pytestmark = pytest.mark.notebook

ROOT = pathlib.Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "notebooks" / "01_quickstart.ipynb"
#: The notebook's promise is well under a minute on a 2-core machine; this bounds its cells' own work.
NOTEBOOK_S = 60.0


def _demo(notebook: pathlib.Path, output: pathlib.Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "raytrain_nb.demo", str(notebook), "--output", str(output)],
                          cwd=ROOT, capture_output=True, text=True, timeout=280)


def _text(cell) -> str:
    return "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")


def _cell(nb, first_line: str):
    matches = [c for c in nb.cells if c.cell_type == "code" and c.source.startswith(first_line)]
    assert len(matches) == 1, f"{len(matches)} cells start with {first_line!r}"
    return matches[0]


@pytest.mark.scripts
def test_quickstart_trains_evaluates_and_shuts_down(tmp_path):
    out = tmp_path / "quickstart.executed.ipynb"
    proc = _demo(QUICKSTART, out)
    assert proc.returncode == 0, f"{proc.stdout}\n{proc.stderr}"
    nb = nbformat.read(out, as_version=4)
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert code[0].source.strip() == "%load_ext raytrain_nb"

    # The demo printed one line per code cell, the training progress, and where the result went.
    for number in range(1, len(code) + 1):
        assert re.search(rf"^\[\s*{number}/{len(code)}\] ", proc.stdout, re.M), proc.stdout
    assert f"executed notebook written to {out}" in proc.stdout
    for cell in code:
        assert not [o for o in cell.outputs if o.output_type == "error"], cell.source
        assert cell.execution_count is not None, cell.source

    start = _cell(nb, "%%distributed --workers 2")
    assert "raytrain_nb: 2 workers ready" in _text(start)
    values = [o.data["text/plain"] for o in start.outputs if o.output_type == "execute_result"]
    assert values == ["'rank 0 of 2: 23 batches of 32 per epoch'"], start.outputs
    # The first cell shows the dashboard, and %dist_dashboard shows it again.
    for cell in (start, _cell(nb, "%dist_dashboard")):
        assert [o for o in cell.outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})], \
            cell.outputs

    # The same training cell twice: streamed one line per epoch, and the second run went on from the first.
    train = [c for c in code if c.source.startswith("%%distributed\nfor _ in range(5)")]
    assert len(train) == 2 and train[0].source == train[1].source
    epochs = [[(int(e), float(v)) for e, v in re.findall(r"^epoch (\d+): loss ([\d.]+)$", _text(c), re.M)]
              for c in train]
    assert [e for e, _ in epochs[0]] == [0, 1, 2, 3, 4] and [e for e, _ in epochs[1]] == [5, 6, 7, 8, 9], epochs
    losses = [v for run in epochs for _, v in run]
    assert losses[4] < 0.5 * losses[0] and losses[5] < 0.5 * losses[0] and losses[9] < losses[4], losses
    assert "epoch 9: loss" in proc.stdout

    per_rank = _text(_cell(nb, "%%distributed --output all")).splitlines()
    assert [line.split("]")[0] for line in per_rank] == ["[rank 0", "[rank 1"], per_rank

    # %dist_status: a table with a row per rank and the metrics each reported last.
    header, *rows = _text(_cell(nb, "%dist_status")).rstrip("\n").splitlines()
    assert header.split()[:5] == ["rank", "node", "pid", "device", "state"], header
    assert [r.split()[0] for r in rows] == ["0", "1"], rows
    assert all("idle" in r and "step=9" in r and "loss=" in r for r in rows), rows

    # The pulled model is a plain module on the notebook side, and it learned the task.
    pulled = _cell(nb, "%dist_pull model")
    assert [o.data["text/plain"].split("(")[0] for o in pulled.outputs if o.output_type == "execute_result"] \
        == ["Sequential"]
    accuracy = float(re.search(r"accuracy on 360 held-out digits: ([\d.]+)%", _text(_cell(nb, "with torch"))).group(1))
    assert accuracy > 85, accuracy
    assert "all checks passed" in _text(_cell(nb, "assert accuracy"))
    assert "shut down" in _text(_cell(nb, "%dist_shutdown"))

    # The notebook's own work stays small. Starting the group (ray.init: 5-15 s here, minutes when
    # other suites load the machine) is excluded; an idle 2-core machine runs the whole demo in ~25 s.
    work = _busy_seconds(c for c in code if c is not start)
    assert work < NOTEBOOK_S, f"the cells after the group started took {work:.1f} s"


def _busy_seconds(cells) -> float:
    """The cells' run time, from the busy/idle times nbclient records in each cell's metadata."""
    def at(cell, key: str) -> datetime.datetime:
        return datetime.datetime.fromisoformat(cell.metadata["execution"][key].replace("Z", "+00:00"))

    return sum((at(c, "iopub.status.idle") - at(c, "iopub.status.busy")).total_seconds() for c in cells)


def test_demo_stops_at_a_failing_cell_with_a_clear_message(tmp_path):
    notebook = tmp_path / "broken.ipynb"
    nbformat.write(new_notebook(cells=[
        new_code_cell("print('first cell ran')"),
        new_code_cell("def load():\n    raise FileNotFoundError('data.csv')\nload()"),
        new_code_cell("print('third cell ran')"),
    ]), notebook)
    out = tmp_path / "broken.executed.ipynb"
    proc = _demo(notebook, out)
    assert proc.returncode == 1
    assert "first cell ran" in proc.stdout and "third cell ran" not in proc.stdout
    assert re.search(r"^\[ 2/3\] def load\(\):.*FAILED", proc.stdout, re.M), proc.stdout
    assert f"demo: a cell of {notebook} failed" in proc.stderr
    assert "FileNotFoundError: data.csv" in proc.stderr
    assert out.exists()  # written anyway, to look at
    log = re.search(r"FAILED \(kernel log: (\S+)\)", proc.stdout)
    assert log and pathlib.Path(log[1]).is_file(), proc.stdout
    pathlib.Path(log[1]).unlink()
    executed = nbformat.read(out, as_version=4)
    assert [o.output_type for o in executed.cells[1].outputs] == ["error"]
