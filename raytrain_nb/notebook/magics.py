"""IPython magics: ``%%distributed`` and the ``%dist_*`` line magics.

Each magic parses its arguments with IPython's ``magic_arguments`` and calls
one public method of :class:`~raytrain_nb.WorkerGroup`; errors in the use of a
magic are one-line ``UsageError``s.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from .._internal.durations import parse_duration
from .._internal.errors import ConfigError, GroupError
from .._internal.group.group import WorkerGroup, active_group
from .._internal.group.kinds import backend_names
from .._internal.group.state import GroupState
from .._internal.group.tables import format_status
from .._internal.group.timing import QUIET_AFTER_S
from . import cells, ui
from .magic_args import need_group, parse_ranks

logger = logging.getLogger(__name__)

_SHAPING = (("workers", "num_workers"), ("cpus", "cpus_per_worker"), ("gpus", "gpus_per_worker"),
            ("backend", "backend"), ("address", "address"), ("spares", "spares"), ("storage", "storage_path"),
            ("name", "name"), ("keep_alive", "keep_alive"))


@magics_class
class DistributedMagics(Magics):
    """The magics registered by ``%load_ext raytrain_nb``."""

    # -- %%distributed ---------------------------------------------------------------------

    @magic_arguments()
    @argument("--workers", "-n", type=int, default=None, help="number of workers (first cell; default 2)")
    @argument("--gpus", type=float, default=None, help="GPUs per worker (first cell; default 0)")
    @argument("--cpus", type=float, default=None, help="CPUs per worker (first cell; default 1)")
    @argument("--backend", choices=list(backend_names()), default=None,
              help="torch.distributed backend, or a framework's own collective (xgboost, lightgbm, tensorflow) "
                   "(first cell; default nccl with GPUs, gloo without)")
    @argument("--address", default=None, help="Ray cluster address (first cell; default RAY_ADDRESS or a local instance)")
    @argument("--ranks", default=None, help="run on these ranks only, e.g. 0,2")
    @argument("--output", choices=["rank0", "all", "none"], default="rank0",
              help="whose output to show: rank0 (default), all (labelled), none")
    @argument("--push", default=None, help="notebook variables to send first, e.g. a,b")
    @argument("--datasets", default=None, help="Ray Data datasets (notebook variables) to split across the "
              "workers, e.g. train=ds,val=val_ds; read with raytrain_nb.get_dataset_shard('train')")
    @argument("--storage", default=None, help="where runs are kept, any fsspec URL (first cell; default "
              "RAYTRAIN_NB_STORAGE_PATH or ~/raytrain_nb_results)")
    @argument("--name", default=None, help="the run's name (first cell; default run-<date>-<time>)")
    @argument("--spares", type=int, default=None, help="standby workers that replace a dead rank fast (first cell)")
    @argument("--keep-alive", dest="keep_alive", default=None, metavar="D",
              help="the group outlives the kernel this long, e.g. 90s, 30m, 2h (first cell; %%dist_attach takes it over "
                   "in a new kernel; default 0: it ends with the kernel)")
    @argument("--setup", action="store_true", help="mark this cell as setup: a new rank replays it")
    @argument("--on-failure", dest="on_failure", choices=["raise", "restart", "rescale"], default="raise",
              help="when a worker dies: raise (default), or restart/rescale and run the cell again")
    @argument("--max-failures", dest="max_failures", type=int, default=1,
              help="how often --on-failure may recover in this cell (default 1; -1: no limit)")
    @argument("--background", action="store_true",
              help="return at once; output keeps coming into this cell (%%dist_wait waits, %%dist_interrupt stops)")
    @argument("--queue", action="store_true", help="wait for a running background cell, then run this one")
    @argument("--track", choices=["mlflow", "wandb"], default=None,
              help="log the group's reports, pushed values and rollbacks to MLflow or W&B (settings from the "
                   "environment: MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_NAME, WANDB_PROJECT, WANDB_MODE)")
    @argument("--steps", type=int, default=None, help="the cell's number of steps, for the progress bars")
    @argument("--quiet-after", dest="quiet_after", type=float, default=QUIET_AFTER_S, metavar="S",
              help="after S seconds without output or report, say once where every rank is (default 60; 0: never)")
    @argument("--no-dashboard", dest="no_dashboard", action="store_true",
              help="do not show the dashboard under the cell that starts the group")
    @cell_magic
    def distributed(self, line: str, cell: str) -> Any:
        """Run the cell on every worker of the distributed group.

        The first ``%%distributed`` cell starts the group (the flags shape it);
        later cells run on the same workers, whose variables stay in memory.
        Output streams back while the cell runs; the value of the last line is
        shown (rank 0's by default). Ctrl-C / the stop button interrupts every rank.

        Example::

            In [1]: %load_ext raytrain_nb

            In [2]: %%distributed --workers 2
               ...: import torch, raytrain_nb as train
               ...: from raytrain_nb.torch import prepare_model
               ...: model = prepare_model(torch.nn.Linear(10, 1))
               ...: train.get_context().get_world_rank()
            Out[2]: 0
        """

        args = parse_argstring(self.distributed, line)
        before = active_group()
        group = self._group_for(args)
        if group is not before and not args.no_dashboard:
            ui.show(group)
        if args.datasets:
            self._attach(args.datasets, group)
        if args.push:
            self._push([n.strip() for n in args.push.split(",") if n.strip()], group)
        if args.track:
            self._track(args.track, group)
        return cells.run_cell(group, cell, args, parse_ranks(args.ranks))

    def _group_for(self, args: Any) -> WorkerGroup:
        group = active_group()
        if args.keep_alive is not None:
            try:
                args.keep_alive = parse_duration(args.keep_alive, "--keep-alive")
            except ConfigError as exc:
                raise UsageError(str(exc)) from None
        given = {attr: getattr(args, flag) for flag, attr in _SHAPING if getattr(args, flag) is not None}
        if group is not None and group.state is not GroupState.SHUTDOWN:
            live = {"num_workers": group.num_workers, "cpus_per_worker": group.config.cpus_per_worker,
                    "gpus_per_worker": group.config.gpus_per_worker, "backend": group.config.framework or group.backend,
                    "address": group.address, "spares": group.num_spares,
                    "storage_path": group.storage_path, "name": group.name, "keep_alive": group.keep_alive}
            diff = [f"--{flag} {given[attr]!r} (the group has {live[attr]!r})" for flag, attr in _SHAPING
                    if attr in given and given[attr] != live[attr]]
            if diff:
                raise UsageError(
                    f"the live group was started differently: {', '.join(diff)}; resize it with "
                    "%dist_rescale N, or %dist_shutdown and start a new one"
                )
            return group
        kwargs: Dict[str, Any] = {"num_workers": 2, **given}
        started = time.perf_counter()
        try:
            group = WorkerGroup(**kwargs)
        except GroupError as exc:
            raise UsageError(str(exc)) from None
        print(f"raytrain_nb: {group.num_workers} workers ready ({group.config.framework or group.backend}) in "
              f"{time.perf_counter() - started:.1f} s; run {group.name} in {group.run_storage.url}")
        return group

    # -- line magics -------------------------------------------------------------------------

    def _attach(self, spec: str, group: WorkerGroup) -> None:
        pairs = [p.strip() for p in spec.split(",") if p.strip()]
        bad = [p for p in pairs if p.count("=") != 1 or not all(p.split("="))]
        if bad:
            raise UsageError(f"--datasets {spec!r}: write name=variable pairs, e.g. --datasets train=ds")
        names = dict(p.split("=") for p in pairs)
        missing = [v for v in names.values() if v not in self.shell.user_ns]
        if missing:
            raise UsageError(f"--datasets: {', '.join(missing)} not defined in the notebook")
        try:
            group.attach_datasets(**{n: self.shell.user_ns[v] for n, v in names.items()})
        except GroupError as exc:
            raise UsageError(str(exc)) from None

    def _push(self, names: List[str], group: WorkerGroup) -> None:
        missing = [n for n in names if n not in self.shell.user_ns]
        if missing:
            raise UsageError(f"name(s) {', '.join(missing)} not defined in the notebook: nothing was pushed")
        try:
            group.push(**{n: self.shell.user_ns[n] for n in names})
        except GroupError as exc:
            raise UsageError(str(exc)) from None

    def _track(self, kind: str, group: WorkerGroup) -> None:
        try:
            group.track(kind)
        except (GroupError, ImportError) as exc:
            raise UsageError(f"--track {kind}: {exc}") from None

    @line_magic
    def dist_status(self, line: str) -> None:
        """Show a table of the group's ranks: rank, node, pid, device, state, last metrics.

        Example::

            In [3]: %dist_status
        """
        print(format_status(need_group().status()))

    @magic_arguments()
    @argument("names", nargs="+", help="notebook variables to send to every worker")
    @line_magic
    def dist_push(self, line: str) -> None:
        """Send notebook variables to every worker's namespace.

        Example::

            In [4]: lr = 0.01
            In [5]: %dist_push lr
        """
        args = parse_argstring(self.dist_push, line)
        self._push(args.names, need_group())

    @magic_arguments()
    @argument("name", help="the worker variable to fetch")
    @argument("--rank", type=int, default=0, help="the rank to fetch it from (default 0)")
    @argument("--all", action="store_true", help="fetch it from every rank, as a list")
    @line_magic
    def dist_pull(self, line: str) -> None:
        """Fetch a worker variable into the notebook (a DDP model unwrapped, tensors on CPU).

        Example::

            In [6]: %dist_pull model
            In [7]: %dist_pull loss --all
        """
        args = parse_argstring(self.dist_pull, line)
        group = need_group()
        if args.all and "--rank" in line:
            raise UsageError("use either --rank R or --all, not both")
        try:
            value = group.pull(args.name, rank=None if args.all else args.rank)
        except GroupError as exc:
            raise UsageError(str(exc)) from None
        self.shell.user_ns[args.name] = value

    @magic_arguments()
    @argument("module", help="the module to re-import on every worker")
    @line_magic
    def dist_reload(self, line: str) -> None:
        """Re-import a module on every worker after editing it (the notebook's folder is importable).

        Example::

            In [8]: %dist_reload mymodel
        """
        args = parse_argstring(self.dist_reload, line)
        try:
            need_group().reload(args.module)
        except GroupError as exc:
            raise UsageError(str(exc)) from None

    @line_magic
    def dist_interrupt(self, line: str) -> None:
        """Interrupt the code running on every rank."""
        need_group().interrupt()

    @line_magic
    def dist_shutdown(self, line: str) -> None:
        """Stop the workers and free their resources.

        Example::

            In [9]: %dist_shutdown
        """
        group = need_group()
        if group.background is not None and not group.background.done():
            raise UsageError("a background cell is running: %dist_interrupt stops it (or %dist_wait waits for it), "
                             "then %dist_shutdown")
        group.shutdown()
        print(f"raytrain_nb: group {group.name} shut down")
