"""Magics for the group's state: checkpoints, rollback, loading a checkpoint, restart, rescale, history."""
from __future__ import annotations

from typing import Any

from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .._internal.checkpoint.manager import CheckpointManager
from .._internal.checkpoint.storage import default_storage_path, join
from .._internal.group.group import active_group
from .._internal.group.tables import format_checkpoints, format_history
from .magic_args import call, need_group


def _report_replay(group: Any) -> None:
    """Say which rank values every rank re-evaluated and which names computed from them it did not, then what
    new ranks went without: setup cells that failed when they replayed them, names no peer could give them
    (they joined all the same)."""
    summary = group.rank_values.summary() if group.rank_values is not None else ""
    if summary:
        print(summary)
    lines = group.take_replay_failures()
    if lines:
        print("the new rank(s) joined without some of their peers' state:")
        for line in lines:
            print("  " + line)


@magics_class
class StateMagics(Magics):
    """Checkpoint, roll back, restart and rescale the live group."""

    @magic_arguments()
    @argument("--name", default=None, help="the snapshot's name (default snapshot_<n>)")
    @argument("--vars", default="", help="plain variables to save too, e.g. epoch,step")
    @argument("--async", dest="background", action="store_true",
              help="copy the state in memory and write it in the background")
    @argument("--delete", default=None, metavar="NAME", help="delete this checkpoint instead")
    @line_magic
    def dist_checkpoint(self, line: str) -> None:
        """Snapshot the warm state of every worker: models, optimizers, schedulers, grad scalers,
        RNG states and the variables named with ``--vars``. Kept until deleted.

        Example::

            In [5]: %dist_checkpoint --name before-lr-change --vars epoch,step
        """
        args = parse_argstring(self.dist_checkpoint, line)
        group = need_group()
        if args.delete:
            call(group.delete_checkpoint, args.delete)
            print(f"deleted {args.delete}")
            return
        names = [v.strip() for v in args.vars.split(",") if v.strip()]
        entry = call(group.checkpoint, args.name, names, blocking=not args.background)
        if entry is None:
            print("snapshot copied; it is being written in the background")
        else:
            print(f"saved {entry.name} ({entry.size_bytes / 1e6:.1f} MB) in {entry.path}")

    @magic_arguments()
    @argument("--run", default=None, help="list another run's checkpoints (no group needed)")
    @argument("--storage", default=None, help="the storage of --run (default: the group's or the default)")
    @line_magic
    def dist_checkpoints(self, line: str) -> None:
        """List the run's snapshots and reported checkpoints (name, kind, time, step, size, metrics).

        Example::

            In [6]: %dist_checkpoints
            In [7]: %dist_checkpoints --run run-20261130-101500
        """
        args = parse_argstring(self.dist_checkpoints, line)
        group = active_group()
        if args.run is None:
            entries = call(need_group().checkpoints)
        else:
            storage = args.storage or (group.storage_path if group is not None else None) or default_storage_path()
            entries = call(lambda: CheckpointManager.load(join(storage, args.run)).list())
        print(format_checkpoints(entries))

    @magic_arguments()
    @argument("name", nargs="?", default="latest", help="the snapshot (default: the latest)")
    @argument("--run", default=None, help="take it from another run in the same storage")
    @argument("--allow-pickle", dest="allow_pickle", action="store_true",
              help="allow unpickling saved --vars that are not plain data")
    @line_magic
    def dist_rollback(self, line: str) -> None:
        """Load a snapshot into the same objects on every worker: the next cell continues from it.

        Example::

            In [8]: %dist_rollback before-lr-change
        """
        args = parse_argstring(self.dist_rollback, line)
        print(call(need_group().rollback, args.name, run=args.run, allow_pickle=args.allow_pickle))

    @magic_arguments()
    @argument("path", help="the checkpoint: a local path or URL (s3://...); {expr} inserts a Python value")
    @argument("--allow-pickle", dest="allow_pickle", action="store_true",
              help="allow unpickling a snapshot's saved --vars that are not plain data")
    @line_magic
    def dist_load(self, line: str) -> None:
        """Load a checkpoint of named state into the same named objects on every worker: a snapshot of
        any run, or the checkpoint a trial saved with ``raytrain_nb.tune.save_state`` (a sweep's winner).

        Example::

            In [11]: best = results.get_best_result()
            In [12]: %dist_load {best.checkpoint.path}
        """
        args = parse_argstring(self.dist_load, line)
        print(call(need_group().load, args.path, allow_pickle=args.allow_pickle))

    @magic_arguments()
    @argument("--from-checkpoint", dest="from_checkpoint", nargs="?", const="latest", default=None,
              metavar="NAME", help="load this snapshot on every rank (default: state from a live peer)")
    @line_magic
    def dist_restart(self, line: str) -> None:
        """Replace dead workers; they get the warm state of a live peer (or a snapshot).

        Example::

            In [9]: %dist_restart
        """
        args = parse_argstring(self.dist_restart, line)
        group = need_group()
        ranks = call(group.restart, from_checkpoint=args.from_checkpoint)
        print(f"restarted rank(s) {', '.join(map(str, ranks))}")
        _report_replay(group)

    @magic_arguments()
    @argument("workers", type=int, help="the new number of workers")
    @line_magic
    def dist_rescale(self, line: str) -> None:
        """Grow or shrink the group, dead workers or not, keeping the warm state.

        Example::

            In [10]: %dist_rescale 1
        """
        args = parse_argstring(self.dist_rescale, line)
        group = need_group()
        call(group.rescale, args.workers)
        print(f"the group has {group.num_workers} workers")
        _report_replay(group)

    @line_magic
    def dist_history(self, line: str) -> None:
        """The cells that ran on the whole group, marked setup (a new rank replays them) or training."""
        print(format_history(need_group().history))
