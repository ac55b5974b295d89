"""Run a notebook headlessly in a real Jupyter kernel, showing each cell as it runs.

Usage::

    python -m raytrain_nb.demo notebooks/01_quickstart.ipynb [--timeout 300] [--output PATH]

Each code cell prints its stream output as it arrives (indented) and one line
with its number, first line and duration. The executed notebook is written next
to the input as ``NAME.executed.ipynb`` (also when a cell fails). Exit status:
0 when every cell ran, 1 when a cell failed, 2 for a usage problem.
Needs the ``dev`` extras (nbclient, nbformat).
"""
from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tempfile
import time
from typing import Any, Optional

from ._internal.lean_entry import defer_iri_grammar

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_INDENT = "        "


class _Progress:
    """Prints cell lines and live stream output to stdout."""

    def __init__(self, cells: list) -> None:
        self.code_cells = [i for i, c in enumerate(cells) if c.cell_type == "code" and c.source.strip()]
        self.started = 0.0
        self.line_open = False  # a cell's header line awaits its duration
        self.at_line_start = True

    def start(self, cell: Any, cell_index: int, **_: Any) -> None:
        if cell_index not in self.code_cells:
            return
        number = self.code_cells.index(cell_index) + 1
        first = cell.source.strip().splitlines()[0]
        print(f"[{number:>2}/{len(self.code_cells)}] {first[:70]}", end="", flush=True)
        self.line_open, self.at_line_start, self.started = True, True, time.perf_counter()

    def stream(self, text: str) -> None:
        if self.line_open:
            print(flush=True)
            self.line_open = False
        for piece in text.splitlines(keepends=True):
            sys.stdout.write((_INDENT if self.at_line_start else "") + piece)
            self.at_line_start = piece.endswith("\n")
        sys.stdout.flush()

    def executed(self, cell: Any, cell_index: int, execute_reply: Any, **_: Any) -> None:
        seconds = time.perf_counter() - self.started
        failed = execute_reply["content"]["status"] != "ok"
        note = f"{seconds:.1f} s" + ("  FAILED" if failed else "")
        if self.line_open:
            print(f"  ({note})", flush=True)
        else:
            print(("" if self.at_line_start else "\n") + f"{_INDENT}({note})", flush=True)
        self.line_open, self.at_line_start = False, True


def _client_class() -> Any:
    from nbclient import NotebookClient  # nbclient: optional or heavy, loaded on first use

    class StreamingClient(NotebookClient):
        """A NotebookClient that also hands stream output to a callback as it arrives."""

        progress: Optional[_Progress] = None

        def output(self, outs: Any, msg: Any, display_id: Any, cell_index: int) -> Any:
            if msg["msg_type"] == "stream" and self.progress is not None:
                self.progress.stream(msg["content"]["text"])
            return super().output(outs, msg, display_id, cell_index)

    return StreamingClient


def run_notebook(path: pathlib.Path, output: pathlib.Path, timeout: float) -> int:
    """Execute ``path`` in a ``python3`` kernel whose cwd is the notebook's folder; write ``output``."""
    import nbformat  # nbformat: optional or heavy, loaded on first use
    # nbclient: a dev dependency, loaded only when a notebook runs
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    nb = nbformat.read(path, as_version=4)
    progress = _Progress(nb.cells)
    client = _client_class()(
        nb, timeout=timeout, kernel_name="python3", resources={"metadata": {"path": str(path.parent)}},
        on_cell_start=progress.start, on_cell_executed=progress.executed,
    )
    client.progress = progress
    started = time.perf_counter()
    # The kernel's own messages (Ray's, the kernel's) go to a log, not between the cells' output.
    with tempfile.NamedTemporaryFile("w", prefix="raytrain_nb-demo-", suffix=".log", delete=False) as log:
        try:
            client.execute(stdout=log, stderr=log)
            status = 0
        except CellExecutionError as exc:
            print(f"\ndemo: a cell of {path} failed:\n{_ANSI.sub('', str(exc)).strip()}", file=sys.stderr)
            status = 1
        except (CellTimeoutError, DeadKernelError) as exc:
            print(f"\ndemo: {path} did not finish: {exc}", file=sys.stderr)
            status = 1
    nbformat.write(nb, output)
    if status == 0:
        pathlib.Path(log.name).unlink(missing_ok=True)
    verdict = "ran" if status == 0 else f"FAILED (kernel log: {log.name})"
    print(f"{path} {verdict} in {time.perf_counter() - started:.1f} s; executed notebook written to {output}")
    return status


def load_notebook_tools() -> None:
    """Import nbclient and nbformat; nbformat's ``jsonschema`` without its IRI grammar built (a second or more
    of CPU at every start, see ``_internal/lean_entry.py``): it is built if a notebook ever checks an IRI."""
    defer_iri_grammar()
    import nbclient  # noqa: F401 - nbclient: a dev dependency, loaded only when a notebook runs
    import nbformat  # noqa: F401 - nbformat: optional or heavy, loaded on first use


def main(argv: Optional[list] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m raytrain_nb.demo",
                                     description="Run a notebook headlessly, printing each cell's progress.")
    parser.add_argument("notebook", type=pathlib.Path, help="the .ipynb to run")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds allowed per cell (default 300)")
    parser.add_argument("--output", type=pathlib.Path, default=None,
                        help="where to write the executed notebook (default: NAME.executed.ipynb beside it)")
    args = parser.parse_args(argv)
    if not args.notebook.is_file():
        parser.error(f"{args.notebook}: no such notebook")
    try:
        load_notebook_tools()
    except ImportError as exc:
        print(f"demo: {exc.name} is not installed: run `make venv` (it installs the dev extras)", file=sys.stderr)
        return 2
    output = args.output or args.notebook.with_name(args.notebook.stem + ".executed.ipynb")
    return run_notebook(args.notebook, output, args.timeout)


if __name__ == "__main__":
    sys.exit(main())
