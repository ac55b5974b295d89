"""Magics that look inside the running group: ``%dist_where`` and ``%dist_debug``."""
from __future__ import annotations

import builtins

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .magic_args import call, need_group
from .sink import NotebookSink


def ask(text: str) -> str:
    """One line from the user: ``input()`` as the kernel has it now (Jupyter's stdin channel in a notebook)."""
    return builtins.input(text)


@magics_class
class DebugMagics(Magics):
    """Where every rank is, and pdb on a rank."""

    @line_magic
    def dist_where(self, line: str) -> None:
        """Show where every rank's running code is now, ranks with the same stack grouped.

        A rank in a ``torch.distributed`` call says which and for how long; a rank whose C code holds its GIL
        says so (with py-spy's stack when py-spy is installed). Works while a ``--background`` cell runs.

        Example::

            In [5]: %dist_where
            rank 1: in time.sleep (cell 5, line 7)
                cell 5, line 7, in <module>: time.sleep(60)
            ranks 0, 2, 3: in all_reduce for 61 s (cell 5, line 4)
                ...
        """
        print(call(need_group().where))

    @magic_arguments()
    @argument("--rank", type=int, default=None, help="the rank to debug (default: the lowest rank that failed)")
    @line_magic
    def dist_debug(self, line: str) -> None:
        """Open pdb post-mortem on a rank's last failure, on that rank's cell thread.

        Type pdb commands into the input box; ``q`` ends the session. The rank's namespace and the group stay as
        they were. Only the last failed cell's frames are kept; the next cell frees them.

        Example::

            In [6]: %dist_debug --rank 1
            ZeroDivisionError: division by zero
            > <cell-4>(3)<module>()
            [rank 1] (Pdb) p x
        """
        args = parse_argstring(self.dist_debug, line)
        sink = NotebookSink()
        try:
            outcome = call(need_group().debug, args.rank, ask, sink)
        finally:
            sink.close()
        if outcome == "ended":
            print("raytrain_nb: the debugger session was ended")
