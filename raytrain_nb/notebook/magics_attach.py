"""Magics for groups that outlive their kernel: ``%dist_detach``, ``%dist_attach``, ``%dist_groups``."""
from __future__ import annotations

import time
from typing import Any, Dict, List

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .._internal.durations import format_duration
from .._internal.group.group import WorkerGroup
from . import ui
from .routing import BackgroundSink, CellRoute
from .magic_args import call, need_group


def format_groups(rows: List[Dict[str, Any]]) -> str:
    """``%dist_groups``'s table: run, size, owner (alive or not), age, idle since, keep-alive left."""
    if not rows:
        return "no keep-alive group is alive here"
    lines = [f"{'run':<32} {'size':>4}  {'owner':<34} {'age':>8}  {'idle':>8}  keep-alive left"]
    for r in rows:
        owner = f"{r['owner']} ({'alive' if r['owner_alive'] else 'gone'})"
        idle = "running" if r["idle_s"] is None else format_duration(r["idle_s"])
        left = ("while attached" if r["keep_alive_left_s"] is None
                else format_duration(r["keep_alive_left_s"])) + f" (of {format_duration(r['keep_alive_s'])})"
        lines.append(f"{r['run']:<32} {r['size']:>4}  {owner:<34} {format_duration(r['age_s']):>8}  {idle:>8}  {left}")
    return "\n".join(lines)


@magics_class
class AttachMagics(Magics):
    """Detach a keep-alive group from this kernel, attach one in another, list those alive."""

    @magic_arguments()
    @argument("--keep-alive", dest="keep_alive", default=None, metavar="D",
              help="how long it lives without a kernel from now, e.g. 90s, 30m, 2h (default: its own)")
    @line_magic
    def dist_detach(self, line: str) -> None:
        """Leave the keep-alive group running without this kernel; ``%dist_attach`` in any kernel takes it back.

        Example::

            In [9]: %dist_detach --keep-alive 2h
        """
        args = parse_argstring(self.dist_detach, line)
        group = need_group()
        if group.background is not None and not group.background.done():  # this kernel would go on reading it
            raise UsageError("a background cell is running: %dist_wait or %dist_interrupt first (a kernel that "
                             "restarts or dies meanwhile leaves it running, and %dist_attach follows it)")
        left = call(group.detach, args.keep_alive)
        print(f"raytrain_nb: group {group.name} detached; it lives {format_duration(left)} without a kernel "
              f"(%dist_attach {group.name} takes it over)")

    @magic_arguments()
    @argument("run", nargs="?", default=None, help="the run to attach (default: the only keep-alive group alive)")
    @argument("--steal", action="store_true", help="take it even from a kernel that is alive (that kernel's next "
              "command is refused)")
    @argument("--address", default=None, help="the Ray cluster it runs on (default RAY_ADDRESS or this machine's "
              "shared instance)")
    @argument("--no-dashboard", dest="no_dashboard", action="store_true", help="do not show the dashboard")
    @line_magic
    def dist_attach(self, line: str) -> None:
        """Take over a keep-alive group that outlived its kernel: the magics and the dashboard act on it from now.

        Example::

            In [1]: %load_ext raytrain_nb
            In [2]: %dist_attach
        """
        args = parse_argstring(self.dist_attach, line)
        if args.run is None:
            rows = call(WorkerGroup.alive_groups, args.address)
            if len(rows) > 1:
                print(format_groups(rows))
        started = time.perf_counter()
        sink = BackgroundSink(CellRoute())  # a cell still running there: its output goes on in this cell
        group = call(WorkerGroup.attach, args.run, steal=args.steal, address=args.address, sink=sink)
        dead = [str(r) for r, s in enumerate(group.slots) if s.gone]
        print(f"raytrain_nb: attached group {group.name} ({group.num_workers} workers, {len(group.history)} cells "
              f"ran) in {time.perf_counter() - started:.1f} s" + (f", {group.attach_note}" if group.attach_note else ""))
        if dead:
            print(f"rank(s) {', '.join(dead)} died meanwhile: %dist_restart replaces them")
        if not args.no_dashboard:
            ui.show(group)

    @magic_arguments()
    @argument("--address", default=None, help="the Ray cluster to look on (default RAY_ADDRESS or this machine's "
              "shared instance)")
    @line_magic
    def dist_groups(self, line: str) -> None:
        """List the keep-alive groups alive: run, size, owner kernel (alive or gone), age, idle, keep-alive left.

        Example::

            In [1]: %dist_groups
        """
        args = parse_argstring(self.dist_groups, line)
        print(format_groups(call(WorkerGroup.alive_groups, args.address)))
