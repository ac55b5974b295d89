"""The repository's documents stand alone: none cites a file outside it (a design note, a sibling checkout)."""
import pathlib
import re
import subprocess
from typing import List

REPO = pathlib.Path(__file__).resolve().parents[2]
#: What is checked: the documents, the package, the tests (as tracked by git; on disk without a git checkout).
ROOTS = ("README.md", "ARCHITECTURE.md", "pyproject.toml", "docs", "raytrain_nb", "tests")
TEXT_SUFFIXES = {".py", ".md", ".toml", ".txt", ".cfg", ".ini", ".json", ".yaml", ".yml", ".ipynb", ".rst", ".sh"}
#: Built from parts, so that this file does not match itself.
NOT_HERE = re.compile("|".join([re.escape("DESIGN" + ".md"), re.escape(".." + "/shared")]))


def _files() -> List[pathlib.Path]:
    try:
        out = subprocess.run(["git", "ls-files", "--", *ROOTS], cwd=REPO, capture_output=True, text=True,
                             timeout=60, check=True).stdout
        paths = [REPO / line for line in out.splitlines() if line]
    except (OSError, subprocess.SubprocessError):
        paths = [p for root in ROOTS for p in ([REPO / root] if (REPO / root).is_file() else (REPO / root).rglob("*"))]
    return [p for p in paths if p.is_file() and (p.suffix in TEXT_SUFFIXES or p.name == "Makefile")]


def test_no_document_cites_a_file_outside_the_repository():
    files = _files()
    assert any(p.name == "ARCHITECTURE.md" for p in files), "the documents were not found"
    found = [f"{p.relative_to(REPO)}:{n}: {line.strip()}"
             for p in files for n, line in enumerate(p.read_text(errors="replace").splitlines(), start=1)
             if NOT_HERE.search(line)]
    assert not found, "references to files that are not in the repository:\n" + "\n".join(found)


def test_the_check_can_fail():
    assert NOT_HERE.search("see " + "DESIGN" + ".md") and NOT_HERE.search("in " + ".." + "/shared/x")
    assert not NOT_HERE.search("ARCHITECTURE.md")
