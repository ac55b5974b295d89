"""The worker: one per rank, a plain class wrapped with ``ray.remote`` when spawned.

User code (cells and functions) runs on one long-lived thread per worker, so grad mode, autocast and the CUDA
device persist between cells. Control calls (``poll``, ``interrupt``, ``release``, ``ping``) run in a separate Ray
concurrency group and are answered while a cell runs.
"""
from __future__ import annotations

import builtins
import importlib
import logging
import os
import sys
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..backend import process_group_state
from ..errors import RankFailure, failure_from_exception
from . import cell as cellmod
from . import snapshot_io
from .capture import OutputBuffer, OutputCapture
from .channel import CELL, CONTROL_METHODS as CHANNEL_CALLS, ChannelWorker
from .cell_thread import CellThread, to_cpu
from .checkpointing import CheckpointingWorker
from .collective import CONTROL_METHODS as COLLECTIVE_CALLS
from .collective import CollectiveSpec, CollectiveWorker, begin as begin_collectives, waiting_at
from .display import WorkerDisplay
from .forming import FormingWorker
from .inspecting import CONTROL_METHODS as INSPECTING_CALLS
from .inspecting import InspectingWorker
from .interrupting import InterruptingWorker
from .mirroring import CONTROL_METHODS as MIRROR_CALLS, MirroringWorker, check_pull
from .node_poll import NodePeers
from .framework import call_in
from .outcome import CellOutcome, pickle_exception
from .session import WorkerSession
from .snapshot import fingerprint

logger = logging.getLogger(__name__)

#: What the cell thread runs while a worker is still starting (its first imports), before any command.
PREPARING = ("_preload", "_warm_imports")


class Worker(FormingWorker, CheckpointingWorker, CollectiveWorker, InspectingWorker, MirroringWorker, ChannelWorker,
             InterruptingWorker):
    """One rank of a :class:`~raytrain_nb.WorkerGroup` (a Ray actor when spawned)."""

    def __init__(self, cwd: Optional[str] = None, sys_path: Sequence[str] = (),
                 env: Optional[Dict[str, str]] = None, capture: bool = True, preload: Sequence[str] = ()) -> None:
        os.environ.setdefault("MPLBACKEND", "Agg")
        for key, value in (env or {}).items():
            os.environ[key] = value
        if cwd and os.path.isdir(cwd):
            os.chdir(cwd)
        for entry in reversed(list(sys_path)):
            if entry not in sys.path:
                sys.path.insert(0, entry)
        self.namespace: Dict[str, Any] = {"__name__": "__main__", "__builtins__": builtins}
        self._buffer: Optional[OutputBuffer] = None
        self._capture = OutputCapture()
        if capture:
            self._capture.install()
        self._display = WorkerDisplay(self.namespace, self._publish)
        self.namespace["display"] = self._display.display
        self._cells = CellThread()
        self._lock = threading.Lock()
        self._node_peers = NodePeers()  # the leader's side of a node's combined poll
        # cells from a driver on this machine (channel.py); rollbacks and loads that need no collective; pulls
        self._init_channel({CELL: self.run_cell_packed, "rollback": self.rollback_packed,
                            "load_state": self.load_state_packed, "pull": self.pull})
        self._in_user = False
        self._interrupt_pending = False
        self._interrupted = False
        self._breaking = False
        self._entered_cell = -1  # the id of the last cell the driver sent whose code began here
        self._sent_cell: Optional[int] = None  # that id, from the cell's start until its code begins
        self._cancel_upto = -1  # sent cells with an id up to this one end as their code would begin (interrupted)
        self._running: Optional[str] = None
        self._last_outcome: Optional[CellOutcome] = None
        self._done = threading.Event()
        self._done.set()
        self.pg = process_group_state()
        self.session: Optional[WorkerSession] = None
        self.rank = -1
        self._join_epoch = 0  # the latest recovery whose join reached this rank (forming.py)
        self._preloaded = threading.Event()
        self.preload_s = 0.0
        self._init_checkpointing()
        self._init_inspecting()
        # Import heavy modules (torch) while the driver sets up the rest of the group, on the cell
        # thread: a second thread importing torch.distributed during that import kills the process.
        self._cells.submit(self._preload, tuple(preload))

    def _preload(self, modules: Sequence[str]) -> None:
        started = time.perf_counter()
        try:
            for name in modules:
                importlib.import_module(name)
        except Exception as exc:  # the real import in user code will report it
            logger.debug("preloading %s failed: %s", modules, exc)
        finally:
            self.preload_s = time.perf_counter() - started  # how long this process spent importing (torch)
            self._preloaded.set()

    def warm(self) -> int:
        """Make a standby worker ready: preloaded modules imported, and what the first optimizer or
        DDP wrapper would import (torch._dynamo, ~1 s). Returns the pid."""
        return self._cells.call(self._warm_imports)

    def _warm_imports(self) -> int:
        if "torch" in sys.modules:
            import torch._dynamo  # noqa: F401 - torch: what the first optimizer or DDP wrapper imports, ahead of time
        return os.getpid()

    # -- identity and setup --------------------------------------------------------------

    def info(self) -> Dict[str, Any]:
        """Where this worker lives: node, IP, pid, GPU ids."""
        out: Dict[str, Any] = {"pid": os.getpid(), "hostname": os.uname().nodename}
        try:
            import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

            ctx = ray.get_runtime_context()
            out["node_id"] = ctx.get_node_id()
            out["node_ip"] = ray.util.get_node_ip_address()
            out["gpu_ids"] = [str(g) for g in ray.get_gpu_ids()]
        except Exception:  # not inside Ray (unit tests)
            out.update(node_id="local", node_ip="127.0.0.1", gpu_ids=[])
        out["cuda_visible_devices"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        return out

    # -- running user code ---------------------------------------------------------------

    def _publish(self, data: Dict[str, Any], metadata: Dict[str, Any]) -> None:
        buf = self._buffer
        if buf is not None:
            buf.display(data, metadata)

    def _failure(self, exc: BaseException) -> RankFailure:
        self.debugger.keep_failure(exc)  # for %dist_debug, until the next cell starts
        tb = cellmod.format_user_traceback(exc)
        return failure_from_exception(self.rank, exc, tb, node=os.uname().nodename, pickled=pickle_exception(exc))

    def _begin(self, label: str) -> OutputBuffer:
        self._inspect_cell_begins()
        buf = OutputBuffer()
        with self._lock:
            self._buffer = buf
            self._running = label
            self._interrupted = False
            self._breaking = False  # an interrupt is breaking this cell's process group (it was in user code)
            self._done.clear()
        self._capture.start(buf)
        if self.session is not None:
            self.session.reports_this_cell = 0
        self.pg.forwards = 0
        return buf

    def _end(self, result: CellOutcome) -> CellOutcome:
        self.uploads.abandon()  # a cell that failed: its uploads still running end before its records are read
        self._take_requested()  # a snapshot asked for during the cell, which reported no step since
        result.shards_stepped = self._shards_stepped()  # sharded models changed: the driver mirrors them
        try:
            self._capture.stop()
        finally:
            with self._lock:
                buf, self._buffer = self._buffer, None
                self._running = None
                self._sent_cell = None
                result.outputs = buf.drain() if buf is not None else []
                result.metrics = self.session.drain() if self.session is not None else []
                result.reports = self.session.reports_this_cell if self.session is not None else 0
                result.forwards = self.pg.forwards
                result.interrupted = self._interrupted
                result.pg_broken = self.pg.broken or self._breaking
                result.pg_sequence = self._kept_group_sequence()
                self._last_outcome = result  # for a driver that attached while the cell ran (its caller is gone)
                self._done.set()
        return result

    def run_cell(self, source: str, cell_id: int, show_value: bool = True, report_base: int = 0,
                 partial: bool = False, framework: Optional[Any] = None,
                 collective: Optional[Any] = None) -> CellOutcome:
        """Run cell source in the persistent namespace; return outputs, value and failure.

        ``report_base`` numbers the checkpoints this cell reports (``checkpoint_<base + i>``);
        ``partial``: the cell runs on some ranks only, so it cannot report a checkpoint;
        ``framework``: ``(backend, spec)`` of a framework backend the cell runs inside (``worker/framework.py``);
        ``collective``: the ``CollectiveSpec`` of its ``raytrain_nb.collective`` calls (None: the rank is alone).
        """
        return self._cells.call(self._run_cell, source, cell_id, show_value, report_base, partial, framework,
                                collective, True)

    def run_cell_packed(self, request: Sequence[Any]) -> List[Any]:
        """:meth:`run_cell` with its arguments in one list, its outcome as :meth:`CellOutcome.to_wire`: the driver's
        path (Ray sends one argument faster than six, and a list of plain values without pickling it)."""
        return self.run_cell(*request[:-1], CollectiveSpec.from_wire(request[-1])).to_wire()

    def _run_cell(self, source: str, cell_id: int, show_value: bool, report_base: int = 0,
                  partial: bool = False, framework: Optional[Any] = None,
                  collective: Optional[Any] = None, sent: bool = False) -> CellOutcome:
        self._report_base, self._partial = report_base, partial
        begin_collectives(collective, partial)
        filename = f"<cell-{cell_id}>"
        self._begin(filename)
        self._sent_cell = cell_id if sent else None  # the driver's cell (not a replayed one): an interrupt may cancel it
        result = CellOutcome(rank=self.rank)
        started = time.perf_counter()
        steps = framework[0].training_steps(self.namespace) if framework is not None else 0
        try:
            try:
                if cellmod.needs_ipython(source) or "display" in source or "IPython" in source:
                    self._display.ensure_shell()
                code = cellmod.transform(source)
                body, tail = cellmod.compile_cell(code, filename)
                value = self._call_user(call_in, framework, cellmod.run_compiled, body, tail, self.namespace)
                self._display.flush_figures()
                if show_value and value is not None:
                    result.value = self._display.format(value)
                result.fingerprint = fingerprint(self.namespace)
            except BaseException as exc:  # noqa: BLE001 - reported to the driver
                try:
                    self._display.flush_figures()
                except Exception:
                    pass
                result.failure = self._failure(exc)
        finally:
            result.duration = time.perf_counter() - started
            if framework is not None:  # the library's models trained: not a setup cell (not replayed)
                self.pg.forwards += max(0, framework[0].training_steps(self.namespace) - steps)
            self._end(result)
        return result

    def execute(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Dict[str, Any],
                report_base: int = 0, partial: bool = False, framework: Optional[Any] = None,
                collective: Optional[Any] = None) -> CellOutcome:
        """Call ``fn(*args, **kwargs)`` on the cell thread (inside ``framework``, with ``collective``, as
        :meth:`run_cell`); return its value or failure."""
        return self._cells.call(self._execute, fn, args, kwargs, report_base, partial, framework, collective)

    def execute_packed(self, request: Sequence[Any]) -> List[Any]:
        """:meth:`execute` with its arguments in one list (the driver's path, as :meth:`run_cell_packed`)."""
        return self.execute(*request[:-1], CollectiveSpec.from_wire(request[-1])).to_wire()

    def _execute(self, fn: Callable[..., Any], args: Sequence[Any], kwargs: Dict[str, Any],
                 report_base: int = 0, partial: bool = False, framework: Optional[Any] = None,
                 collective: Optional[Any] = None) -> CellOutcome:
        self._report_base, self._partial = report_base, partial
        begin_collectives(collective, partial)
        self._begin(getattr(fn, "__name__", "function"))
        result = CellOutcome(rank=self.rank)
        started = time.perf_counter()
        try:
            try:
                result.value = self._call_user(call_in, framework, lambda: fn(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001
                result.failure = self._failure(exc)
        finally:
            result.duration = time.perf_counter() - started
            self._end(result)
        return result

    def load_state(self, url: str, allow_pickle: bool = False, files: Optional[Dict[str, int]] = None,
                   meta: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """Load a checkpoint of named state (a snapshot, ``tune.save_state``'s) into this rank's objects (``files``,
        ``meta``: its files as the driver checked them and its ``snapshot.json`` as the driver read it)."""
        return self._cells.call(snapshot_io.load, self.namespace, url, self.rank, allow_pickle, "load", files, meta)

    def push(self, values: Dict[str, Any]) -> None:
        self.namespace.update(values)

    def pull(self, name: str) -> Any:
        if name not in self.namespace:
            raise NameError(f"name {name!r} is not defined on rank {self.rank}")
        check_pull(name, self.namespace[name])  # a sharded model: the driver gathers it (below a size) or refuses
        return to_cpu(self.namespace[name])

    # -- control channel (answered while a cell runs) -------------------------------------

    def ping(self) -> int:
        return os.getpid()

    def watch(self) -> None:
        """Never returns while this process lives (a shutdown kills it): the driver notices this worker's death by
        this call failing."""
        threading.Event().wait()

    def poll(self) -> Dict[str, Any]:
        """Output and metrics produced since the last poll."""
        with self._lock:
            buf = self._buffer
            running = self._running
        return {
            "outputs": buf.drain() if buf is not None else [],
            "metrics": self.session.drain() if self.session is not None else [],
            "running": running,
            "collective": waiting_at(),
            **self._inspect_poll(), **self._mirror_poll(),
        }

    def poll_node(self, ranks: Sequence[int], handles: Optional[Dict[int, Any]] = None) -> Dict[int, Dict[str, Any]]:
        """:meth:`poll` of ``ranks`` of this node (this one among them) in one reply (``node_poll.py``);
        ``handles``: the peers' actor handles, sent once."""
        return self._node_peers.poll(self.rank, self.poll, ranks, handles)

    def last_outcome(self) -> Optional[CellOutcome]:
        """The last cell's outcome (its last output and reports too), once: for a driver that attached while it ran."""
        with self._lock:
            outcome, self._last_outcome = self._last_outcome, None
        return outcome

    def activity(self) -> Dict[str, Any]:
        """What the cell thread does now: ``{"call": "_join"|"_setup"|"_run_cell"|...|None, "phase": ...,
        "preparing": ...}`` (the driver checks that every rank it waits for in a collective step is in that
        step; ``preparing``: the worker is still starting, importing the modules it begins with, and any
        call sent meanwhile waits behind that)."""
        call = self._cells.current
        return {"call": call, "phase": self.pg.phase, "preparing": call in PREPARING}

CONTROL_METHODS = ("ping", "poll", "poll_node", "activity", "release", "stack", "interrupt", "request_snapshot",
                   "cancel_snapshot", "snapshot_wait", "pull") + COLLECTIVE_CALLS + INSPECTING_CALLS + MIRROR_CALLS + CHANNEL_CALLS  # pull: in a cell too
for _name in CONTROL_METHODS:  # what ray.method(concurrency_group="control") sets
    getattr(Worker, _name).__ray_concurrency_group__ = "control"
Worker.watch.__ray_concurrency_group__ = "monitor"

_REMOTE: Any = None


def remote_worker_class() -> Any:
    """``Worker`` as a Ray actor class with a ``control`` concurrency group."""
    global _REMOTE
    if _REMOTE is None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        _REMOTE = ray.remote(concurrency_groups={"control": 4, "monitor": 1})(Worker)
    return _REMOTE
