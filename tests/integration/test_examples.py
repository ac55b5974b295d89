"""Ray Train scripts (examples/) run on raytrain_nb after changing only their imports.

Each example is written for ``ray.train``; the test rewrites its import lines
(``ray.train.torch`` -> ``raytrain_nb.torch``, ``ray.train`` -> ``raytrain_nb``), checks that no
other line changed and no ``ray.train`` is left, and runs them (the torch ones here; the framework ones in their
own test modules) in one fresh Python process (one Ray start for all), each as ``__main__``.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
# torch_data.py first: its ray.data call starts Ray implicitly, which must give the quiet embedded instance
EXAMPLES = ["torch_data.py", "torch_quickstart.py", "torch_fault_tolerance.py", "torch_collective.py",
            "torch_configs_v2.py", "transformers_torch_trainer.py", "tune_torch.py", "local_mode.py",
            "results_and_errors.py", "torch_checkpoints_v2.py"]
_IMPORT = re.compile(r"^\s*((import|from)\s+ray\.(train|tune\.integration\.ray_train)\b|from ray import train\s*$)")


def port(source: str) -> str:
    """Rewrite only the import lines of a Ray Train script."""
    out = []
    for line in source.splitlines(keepends=True):
        if _IMPORT.match(line) and line.lstrip().startswith("from ray import train"):  # Ray's docs' idiom
            line = line.replace("from ray import train", "import raytrain_nb as train")
        elif _IMPORT.match(line):
            line = line.replace("ray.tune.integration.ray_train", "raytrain_nb.tune")  # ray.tune itself stays
            line = line.replace("ray.train.torch", "raytrain_nb.torch").replace("ray.train", "raytrain_nb")
        out.append(line)
    return "".join(out)


def test_port_changes_only_import_lines():
    for name in EXAMPLES:
        source = (ROOT / "examples" / name).read_text()
        ported = port(source)
        changed = [(a, b) for a, b in zip(source.splitlines(), ported.splitlines()) if a != b]
        assert changed and all(_IMPORT.match(a) and b.lstrip().startswith(("import raytrain_nb", "from raytrain_nb"))
                                for a, b in changed)
        body = ported.split('"""', 2)[2]  # after the module docstring, which names both packages
        assert "ray.train" not in body, name


RUNNER = textwrap.dedent("""
    import json, runpy, sys, time
    results = {}
    for path in sys.argv[1:]:
        print("--- " + path.rsplit("/", 1)[-1], file=sys.stderr, flush=True)
        started = time.perf_counter()
        runpy.run_path(path, run_name="__main__")
        results[path.rsplit("/", 1)[-1]] = round(time.perf_counter() - started, 1)
    print("TIMES " + json.dumps(results))
""")


# exclusive: two Tune trials of two workers each fill the machine; beside another lane's test a trial failed
@pytest.mark.scripts
@pytest.mark.exclusive
@pytest.mark.timeout(600)
def test_ray_train_examples_run_after_the_import_change(tmp_path):
    paths = []
    for name in EXAMPLES:
        path = tmp_path / name
        path.write_text(port((ROOT / "examples" / name).read_text()))
        paths.append(str(path))
    env = {**os.environ, "RAYTRAIN_NB_STORAGE_PATH": str(tmp_path / "runs"), "TUNE_STORAGE_PATH": str(tmp_path / "tune"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", RUNNER, *paths], capture_output=True, text=True, timeout=580,
                          env=env, cwd=tmp_path)
    out = proc.stdout
    assert proc.returncode == 0, (out[-3000:], proc.stderr[-5000:])
    for marker in ("QUICKSTART OK", "DATA OK", "FAULT TOLERANCE OK", "COLLECTIVE OK", "TRANSFORMERS OK", "TUNE OK",
                   "LOCAL MODE OK", "WORKER GROUP ERROR OK", "CONFIGS V2 OK", "CHECKPOINTS V2 OK"):
        assert marker in out
    # worker output carries its rank; progress goes to stderr, one line per report
    assert "[rank 0] {'epoch': 2" in out, out[-3000:]
    assert re.search(r"\(quickstart-\d+\) report 3: epoch=2 loss=", proc.stderr)
    # the crash after epoch 2's report resumes from that very checkpoint
    final = [l for l in out.splitlines() if l.startswith("final metrics:")][-1]
    assert "'start_epoch': 3" in final, final
    assert "Traceback" not in proc.stderr.split("attempt 1 failed")[0]
    # no Ray log flood: Ray Data's coordinator and Ray's own start-up lines stay out of the terminal; local mode runs
    # Ray Data in the script's own process, whose progress lines are Ray Data's own there (as under Ray Train)
    local = re.search(r"(?ms)^--- local_mode\.py$.*?(?=^--- |\Z)", proc.stderr)
    elsewhere = proc.stderr.replace(local.group(0), "") if local else proc.stderr
    for noise in ("SplitCoordinator", "Running Dataset", "Started a local Ray instance", "(raylet)"):
        assert noise not in (elsewhere if noise == "Running Dataset" else proc.stderr) and noise not in out, noise
    times = json.loads(next(l for l in out.splitlines() if l.startswith("TIMES "))[6:])
    assert set(times) == set(EXAMPLES)
