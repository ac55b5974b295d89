"""binder/ is what Binder (repo2docker) installs: complete, consistent with pyproject.toml and the pins."""
from __future__ import annotations

import os
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet

ROOT = Path(__file__).resolve().parents[2]
BINDER = ROOT / "binder"


def _pyproject():
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def _lines(path: Path):
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.strip().startswith("#")]


def _pins():
    return {Requirement(ln).name: Requirement(ln) for ln in _lines(ROOT / "constraints.txt")}


def test_python_is_pinned_to_one_the_package_supports():
    runtime = (BINDER / "runtime.txt").read_text().strip()
    assert re.fullmatch(r"python-3\.\d+", runtime), runtime
    version = runtime.split("-")[1]
    assert SpecifierSet(_pyproject()["project"]["requires-python"]).contains(version + ".0")


def test_requirements_name_the_package_and_take_torch_from_the_cpu_index_as_an_extra_index():
    lines = _lines(BINDER / "requirements.txt")
    assert "--extra-index-url https://download.pytorch.org/whl/cpu" in lines
    assert not any(ln.startswith(("--index-url", "-i ")) for ln in lines), "PyPI must stay the main index"
    package = [ln for ln in lines if ln == "." or ln.startswith((".[", "-e .", "-e .["))]
    assert len(package) == 1, "binder/requirements.txt must install this package ('.'): repo2docker will not"
    extras = set(re.findall(r"\[(.*)\]", package[0])[0].split(",")) if "[" in package[0] else set()
    assert extras <= set(_pyproject()["project"]["optional-dependencies"]), extras


def test_every_pin_is_the_development_pin_and_satisfies_pyproject():
    lines = [ln for ln in _lines(BINDER / "requirements.txt") if not ln.startswith(("-", "."))]
    pins = _pins()
    declared = {Requirement(d).name: Requirement(d) for d in _pyproject()["project"]["dependencies"]}
    assert {"torch", "ray"} <= {Requirement(ln).name for ln in lines}
    for ln in lines:
        req = Requirement(ln)
        (spec,) = list(req.specifier)
        assert spec.operator == "==", f"{ln}: pin an exact version, as constraints.txt does"
        assert str(pins[req.name].specifier) == str(req.specifier), f"{ln} differs from constraints.txt"
        if req.name in declared:
            assert declared[req.name].specifier.contains(spec.version), f"{ln} is outside pyproject's {declared[req.name]}"


def test_start_runs_at_every_launch_and_hands_over():
    start = BINDER / "start"
    text = start.read_text()
    assert text.startswith("#!/bin/bash\n")
    assert os.access(start, os.X_OK), "binder/start must be executable"
    assert text.rstrip().splitlines()[-1] == 'exec "$@"'
