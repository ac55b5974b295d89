"""The tutorial notebooks (notebooks/02_* on; the quickstart has tests/notebook/test_quickstart.py), each run
top to bottom in a real kernel as ``make demo`` runs a notebook, with the embedded instance told it has the
Binder pod's 1 CPU and 2 GB. Each notebook ends with cells that assert its own outcome, so a notebook that
runs without an error did what its prose says.

Two notebooks run at a time, longest first: each is a kernel with a Ray instance told it has one CPU, so two
fill this 2-core machine the way one pod fills its CPU, and nothing else of the suite runs beside them (timed
tests elsewhere keep the machine to themselves). Each has a storage folder of its own.

The runs are not part of ``make test``: CI's Binder check (``make binder-check``) runs every notebook the same
way, in the environment Binder installs, under the pod's limits, so ``make test`` would only run them twice.
``make tutorials`` runs them here (``RAYTRAIN_NB_TUTORIALS=1``); the check of how they are saved always runs."""
from __future__ import annotations

import concurrent.futures
import os
import pathlib
import subprocess
import sys
from typing import Dict, Tuple

import nbformat
import pytest

# exclusive: two kernels fill the machine; the other test lane waits (tests/lanes.py)
pytestmark = [pytest.mark.notebook, pytest.mark.exclusive]

ROOT = pathlib.Path(__file__).resolve().parents[2]
TUTORIALS = sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")
                   if not p.name.startswith("01_") and not p.name.endswith(".executed.ipynb"))
#: What binder/start and the pod's limits give a kernel on Binder (the CPU quota is read from the cgroup there).
POD_ENV = {"RAYTRAIN_NB_NUM_CPUS": "1", "RAYTRAIN_NB_MEMORY_BYTES": str(2 * 10**9), "OMP_NUM_THREADS": "1"}
#: The longest first (one-CPU times in notebooks/README.md), so the pair that runs last is short.
LONGEST_FIRST = ["07_hyperparameter_search", "03_failures_and_rescale", "06_notebook_to_job", "05_ray_data"]
#: Notebooks run at once: one per core of this 2-core machine, as each has one CPU.
AT_ONCE = 2


def test_every_tutorial_is_in_the_series_and_saved_without_outputs():
    names = [p.name for p in TUTORIALS]
    assert len(names) >= 5, names
    for path in TUTORIALS:
        nb = nbformat.read(path, as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        assert code and nb.cells[0].cell_type == "markdown", f"{path.name}: starts with prose, then code"
        assert code[0].source.strip() == "%load_ext raytrain_nb", f"{path.name}: the first code cell loads the magics"
        assert not [c for c in code if c.outputs or c.execution_count], f"{path.name}: saved with outputs"
        assert "assert " in code[-1].source or "assert " in code[-2].source, \
            f"{path.name}: its last cells must assert the notebook's outcome"


#: One tutorial's run: the process and the executed notebook it wrote.
Run = Tuple[subprocess.CompletedProcess, pathlib.Path]


def _run(path: pathlib.Path, folder: pathlib.Path) -> Run:
    """Execute one tutorial as ``make demo`` does, under the pod's settings; the run and its executed notebook."""
    out = folder / f"{path.stem}.executed.ipynb"
    env = {**os.environ, **POD_ENV, "RAYTRAIN_NB_STORAGE_PATH": str(folder / "runs")}
    proc = subprocess.run([sys.executable, "-m", "raytrain_nb.demo", str(path), "--output", str(out),
                           "--timeout", "240"], cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    return proc, out


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> Dict[str, "concurrent.futures.Future[Run]"]:
    """Every selected tutorial started, :data:`AT_ONCE` at a time, longest first; each test waits for its own."""
    chosen = {item.callspec.params["path"] for item in request.session.items
              if item.module is request.module and hasattr(item, "callspec")}
    order = sorted(chosen, key=lambda p: ((LONGEST_FIRST + [p.stem]).index(p.stem), p.stem))
    pool = concurrent.futures.ThreadPoolExecutor(AT_ONCE, thread_name_prefix="tutorial")
    futures = {p.stem: pool.submit(_run, p, tmp_path_factory.mktemp(p.stem)) for p in order}
    yield futures
    pool.shutdown(wait=True)


@pytest.mark.skipif(os.environ.get("RAYTRAIN_NB_TUTORIALS") != "1",
                    reason="the tutorials run in `make tutorials` and in CI's Binder check (make binder-check)")
@pytest.mark.timeout(960)
@pytest.mark.parametrize("path", TUTORIALS, ids=[p.stem for p in TUTORIALS])
def test_tutorial_runs_top_to_bottom_on_one_cpu(path, runs):
    proc, out = runs[path.stem].result(timeout=900)  # each run ends by its own 600 s limit; all take ~3 min here
    assert proc.returncode == 0, f"{proc.stdout[-6000:]}\n{proc.stderr[-4000:]}"
    nb = nbformat.read(out, as_version=4)
    for cell in nb.cells:
        if cell.cell_type == "code":
            assert cell.execution_count is not None, f"{path.name}: a cell did not run: {cell.source[:80]!r}"
            assert not [o for o in cell.outputs if o.output_type == "error"], cell.source
