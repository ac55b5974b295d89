"""pdb on a rank from a real kernel: its prompts come through Jupyter's stdin channel (``input_request``)."""
from __future__ import annotations

import pytest

from .nbkernel import strip_ansi

pytestmark = pytest.mark.ray

SETUP = "import raytrain_nb as train\nrank = train.get_context().get_world_rank()"


def test_breakpoint_pauses_rank_1_and_takes_pdb_commands_from_stdin(kernel):
    kernel.ensure_group(SETUP)
    cell = kernel.submit("%%distributed\ny = 1\nif rank == 1:\n    breakpoint()\ny = rank + 2\n", allow_stdin=True)
    prompts = kernel.answer(["p rank * 7", "c"])
    kernel.finish(cell).check()
    assert prompts == ["[rank 1] (Pdb) ", "[rank 1] (Pdb) "]
    assert "7\n" in cell.stdout and "<cell-" in cell.stdout, cell.stdout
    assert kernel.ok("%dist_pull y --all\ny").value == "[2, 3]"


def test_interrupt_at_the_prompt_ends_the_session_and_the_cell_and_keeps_the_group(kernel):
    kernel.ensure_group(SETUP)
    cell = kernel.submit("%%distributed\nv = 1\nif rank == 0:\n    breakpoint()\nv = rank + 5\n", allow_stdin=True)
    assert kernel.await_prompt() == "[rank 0] (Pdb) "
    kernel.interrupt()  # Ctrl-C / the stop button while the prompt waits
    kernel.finish(cell)
    assert cell.status == "error" and "KeyboardInterrupt" in cell.error_text, cell.describe()
    where = kernel.ok("%dist_where").stdout
    assert "ranks 0, 1: idle" in where, where  # rank 0 left pdb, rank 1 stopped waiting for it
    kernel.ok("%%distributed\nv = rank + 9")
    assert kernel.ok("%dist_pull v --all\nv").value == "[9, 10]"


def test_without_stdin_breakpoint_is_refused_in_one_line(kernel):
    cell = kernel.ok("%%distributed\nif rank == 1:\n    breakpoint()\nw = 3\n")
    lines = [ln for ln in strip_ansi(cell.stderr).splitlines() if "breakpoint()" in ln]
    assert lines == ["raytrain_nb: breakpoint() on rank 1 skipped: this front end does not take input "
                     "(no stdin channel)"], cell.stderr


def test_dist_debug_opens_post_mortem_on_the_failed_rank(kernel):
    failed = kernel.run("%%distributed\nz = rank * 10\nif rank == 1:\n    1 / 0\n")
    assert failed.status == "error"
    cell = kernel.submit("%dist_debug", allow_stdin=True)
    prompts = kernel.answer(["p z", "q"])
    kernel.finish(cell).check()
    assert prompts == ["[rank 1] (Pdb) "] * 2
    assert "ZeroDivisionError: division by zero" in cell.stdout and "10\n" in cell.stdout, cell.stdout
    assert "ranks 0, 1: idle" in kernel.ok("%dist_where").stdout
