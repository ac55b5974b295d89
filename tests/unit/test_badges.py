"""The README's Binder badges: one per notebook and one for the series, all derived from one address."""
from __future__ import annotations

import importlib.util
import re
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _badges():
    spec = importlib.util.spec_from_file_location("badges", ROOT / "tools" / "badges.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_notebook_has_its_badge_opening_it_in_jupyterlab():
    readme = (ROOT / "README.md").read_text()
    address = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["raytrain_nb"]["binder-repository"]
    notebooks = sorted(p.name for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb")
                       if not p.name.endswith(".executed.ipynb"))
    assert notebooks and notebooks[0] == "01_quickstart.ipynb", notebooks
    for name in notebooks:
        assert f"https://mybinder.org/v2/{address}?urlpath=lab/tree/notebooks/{name})" in readme, \
            f"README.md has no Binder badge for {name}: run `python tools/badges.py`"
    assert f"https://mybinder.org/v2/{address}?urlpath=lab/tree/notebooks)" in readme, "the series' badge"


def test_badges_are_written_from_the_one_address_only():
    badges = _badges()
    readme = (ROOT / "README.md").read_text()
    assert badges.rewrite(readme) == readme, "README.md's badges are out of date: run `python tools/badges.py`"
    addresses = set(re.findall(r"https://mybinder\.org/v2/([^?)\s]+)", readme))
    assert addresses == {badges.repository()}, addresses


def test_a_malformed_address_is_refused_in_one_line(monkeypatch, tmp_path):
    badges = _badges()
    (tmp_path / "pyproject.toml").write_text('[tool.raytrain_nb]\nbinder-repository = "github.com/me/repo"\n')
    monkeypatch.setattr(badges, "ROOT", tmp_path)
    try:
        badges.repository()
    except ValueError as exc:
        assert str(exc).startswith("binder-repository='github.com/me/repo' is not gh/OWNER/REPO/REF: fix")
    else:
        raise AssertionError("a malformed address was accepted")
