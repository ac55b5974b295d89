"""The README's Binder badges, derived from the one repository address in pyproject.toml.

``[tool.raytrain_nb] binder-repository`` (mybinder.org's ``gh/OWNER/REPO/REF`` form) is the only place the
address is written. ``python tools/badges.py`` rewrites the README's block between the badge markers: one
badge for the series and one per notebook in notebooks/, each opening JupyterLab on its notebook
(``urlpath=lab/tree/notebooks/<file>.ipynb``). ``--check`` only compares (tests/unit/test_badges.py).
"""
from __future__ import annotations

import json
import pathlib
import re
import sys
import tomllib
from typing import List, Optional

ROOT = pathlib.Path(__file__).resolve().parents[1]
BEGIN = "<!-- binder badges: written by `python tools/badges.py` from pyproject.toml; do not edit -->"
END = "<!-- end of binder badges -->"
LOGO = "https://mybinder.org/badge_logo.svg"


def repository() -> str:
    """The repository's address on mybinder.org (``gh/OWNER/REPO/REF``)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["raytrain_nb"]
    address = config["binder-repository"]
    if not re.fullmatch(r"gh/[\w.-]+/[\w.-]+/[\w./-]+", address):
        raise ValueError(f"binder-repository={address!r} is not gh/OWNER/REPO/REF: fix [tool.raytrain_nb] in "
                         "pyproject.toml")
    return address


def notebooks() -> List[pathlib.Path]:
    return sorted(p for p in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb") if not p.name.endswith(".executed.ipynb"))


def title(path: pathlib.Path) -> str:
    """The notebook's first markdown heading."""
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "markdown":
            text = "".join(cell["source"])
            match = re.search(r"^#\s+(.+)$", text, re.M)
            if match:
                return match[1].strip()
    raise ValueError(f"{path.name} has no markdown title (a '# ...' line in its first markdown cell): add one")


def url(urlpath: Optional[str]) -> str:
    base = f"https://mybinder.org/v2/{repository()}"
    return base if urlpath is None else f"{base}?urlpath={urlpath}"


def block() -> str:
    lines = [BEGIN, f"[![Binder]({LOGO})]({url('lab/tree/notebooks')}) the tutorial series on Binder "
             "(1 CPU, 2 GB; nothing to install)", "", "| notebook | on Binder |", "|---|---|"]
    for path in notebooks():
        lines.append(f"| [{path.stem[:2]} {title(path)}](notebooks/{path.name}) | "
                     f"[![Binder]({LOGO})]({url('lab/tree/notebooks/' + path.name)}) |")
    lines.append(END)
    return "\n".join(lines)


def rewrite(readme: str) -> str:
    if BEGIN not in readme or END not in readme:
        raise ValueError(f"README.md has no badge block: add the lines {BEGIN!r} and {END!r} where it goes")
    head, rest = readme.split(BEGIN, 1)
    return head + block() + rest.split(END, 1)[1]


def main(argv: List[str]) -> int:
    readme = ROOT / "README.md"
    text = readme.read_text()
    new = rewrite(text)
    if "--check" in argv:
        if new != text:
            print("README.md's Binder badges are out of date: run `python tools/badges.py`", file=sys.stderr)
            return 1
        return 0
    readme.write_text(new)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
