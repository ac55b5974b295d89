"""One tracked run of one run directory: reports logged at their report index, in the background.

A :class:`Tracker` is what a trainer's callback and a group's ``track()`` both drive. Its step is the run's report
index, which keeps counting across cells, restarts, resumes and kernels; a report whose index is not above the last
one logged is never logged (so no step is written twice). Everything that talks to the tracking library runs on
the tracker's :class:`~.background.BackgroundLog` thread: opening (or resuming) the tracked run whose id the run
directory keeps (``tracking.json``), the config, metric rows (many reports in one request), checkpoints, notes.
"""
from __future__ import annotations

import collections
import dataclasses
import importlib.util
import itertools
import logging
import threading
import time
from typing import Any, Deque, Dict, List, Mapping, Optional, Sequence, Tuple

from ..checkpoint.storage import is_local, resolve
from .background import BackgroundLog, Rejected
from .reports import metric_row, plain_params
from .state import lookup, remember

logger = logging.getLogger(__name__)

#: Reports sent in one request at most.
BATCH = 200
#: How long a tracker's close waits for what is queued, while the destination answers (then it goes on in the
#: background).
CLOSE_WAIT_S = 10.0
KINDS = ("mlflow", "wandb")

Row = Tuple[int, Sequence[Mapping[str, Any]], float]  # a report waiting: index, metrics by rank, time


@dataclasses.dataclass(frozen=True)
class TrackerSpec:
    """Which tracker, with the keyword arguments of its callback (``MLflowLoggerCallback(...)``'s)."""

    kind: str
    options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ValueError(f"tracker {self.kind!r} is unknown: use 'mlflow' or 'wandb'")

    def backend(self) -> Any:
        """A new backend for this tracker (the library is imported later, on the tracker's thread)."""
        if self.kind == "mlflow":
            from .mlflow_backend import MLflowBackend  # its module names MLflow's calls; small

            return MLflowBackend(**self.options)
        from .wandb_backend import WandbBackend  # its module names W&B's calls; small

        return WandbBackend(**self.options)


class Tracker:
    """The tracked run of the run at ``run_url``: see the module's docstring.

    Args:
        backend: an ``MLflowBackend`` or ``WandbBackend`` (``TrackerSpec.backend()``).
        run_url: the run directory (where ``tracking.json`` keeps the tracked run's id).
        run_name: the run's name (the tracked run's name).
    """

    def __init__(self, backend: Any, run_url: str, run_name: str) -> None:
        self.backend = backend
        self.run_url = run_url
        self.run_name = run_name
        self.log = BackgroundLog(backend.describe(), permanent=self.permanent)
        self.last_step: Optional[int] = None
        self.skipped = 0  # reports not logged: their index was not above the last one logged
        self.closed = False
        self._rows: Deque[Row] = collections.deque()
        self._rows_lock = threading.Lock()
        self._drain_queued = False
        self._rows_full = False

    def permanent(self, exc: BaseException) -> bool:
        """Whether retrying cannot help: a missing library, or what the backend says (a refused value)."""
        return isinstance(exc, ImportError) or self.backend.permanent(exc)

    @property
    def run_id(self) -> Optional[str]:
        """The tracked run's id once it is open (None before)."""
        return self.backend.run_id

    @property
    def dropped(self) -> int:
        """Calls and reports not logged because too many waited (the destination was down a long time)."""
        return self.log.dropped

    def start(self, params: Optional[Mapping[str, Any]] = None) -> None:
        """Open (or resume) the tracked run in the background, then log ``params`` (the plain ones)."""
        self.log.submit(self._open, plain_params(params), label="opening the tracked run")

    def _open(self, params: Dict[str, Any]) -> None:
        if self.backend.run_id is None:
            key = self.backend.state_key()
            self.backend.open(lookup(self.run_url, key), self.run_name, self.run_url)
            self.log.what = self.backend.describe()
            remember(self.run_url, key, self.backend.state_entry())
            logger.info("%s: tracked run %s for run %s", self.log.what, self.backend.run_id, self.run_name)
        if params:
            self.backend.log_params(params, self.last_step or 0)

    # -- the caller's side: every method appends and returns -----------------------------------------

    def log_report(self, index: int, metrics_by_rank: Sequence[Mapping[str, Any]], time_s: Optional[float] = None,
                   checkpoint: Optional[Tuple[str, str]] = None) -> bool:
        """Log one report at step ``index`` (rank 0's numbers, means where ranks differ) and its committed
        ``checkpoint`` (``(name, url)``); False when it is not logged (closed, or ``index`` not above the last)."""
        if self.closed:
            return False
        self.log.name_if_slow()
        if self.last_step is not None and index <= self.last_step:
            self.skipped += 1
            logger.debug("report %d not logged: step %d was logged already", index, self.last_step)
            return False
        self.last_step = index
        row = (index, metrics_by_rank, time_s or time.time())  # made into numbers on the tracker's thread
        with self._rows_lock:
            if len(self._rows) >= self.log.capacity:
                self.log.dropped += 1
                first, self._rows_full = not self._rows_full, True
                submit = False
            else:
                first = False
                self._rows.append(row)
                submit, self._drain_queued = not self._drain_queued, True
        if first:
            logger.warning("%s: %d reports wait already; newer ones are not logged until it catches up",
                           self.log.what, self.log.capacity)
        if submit:
            self.log.submit(self._drain, label="metrics", force=True)
        if checkpoint is not None:
            self.log.submit(self.backend.log_checkpoint, index, checkpoint[0], checkpoint[1],
                            _local_path(checkpoint[1]), label="a checkpoint")
        return True

    def log_params(self, params: Mapping[str, Any]) -> None:
        """Log config values (the plain ones); a value that changed is recorded with the report index."""
        plain = plain_params(params)
        if plain and not self.closed:
            self.log.submit(self.backend.log_params, plain, self.last_step or 0, label="parameters")

    def note(self, kind: str, text: str, index: Optional[int] = None) -> None:
        """Record an event (``kind``: ``rollback``, ``failure``, ``recovery``) in the tracked run, as a tag/note
        that names the report index it happened after."""
        if not self.closed:
            at = (self.last_step or 0) if index is None else index
            self.log.submit(self._note, kind, at, text, label=f"a {kind} note")

    def _note(self, kind: str, index: int, text: str) -> None:
        entry = self.backend.note(kind, index, text)
        if entry:
            remember(self.run_url, self.backend.state_key(), entry)

    def flush(self, timeout_s: float = 30.0) -> bool:
        """Wait up to ``timeout_s`` for everything queued to be logged; True when it is."""
        return self.log.flush(timeout_s)

    def close(self, failed: bool = False, wait_s: float = CLOSE_WAIT_S) -> bool:
        """End the tracked run (``FAILED`` / exit code 1 when ``failed``) after what is queued; waits up to
        ``wait_s`` only while the destination answers. True when everything was logged."""
        if self.closed:
            return not self.log.pending
        self.closed = True
        self.log.submit(self.backend.end, failed, label="ending the tracked run", force=True)
        return self.log.close(wait_s)

    # -- the tracker's thread ------------------------------------------------------------------------

    def _drain(self) -> None:
        """Send the waiting rows, :data:`BATCH` at a time, oldest first (a failure keeps them for the retry)."""
        while True:
            with self._rows_lock:
                if not self._rows:
                    self._drain_queued = False
                    return
                batch: List[Row] = list(itertools.islice(self._rows, BATCH))
            try:
                self.backend.log_metrics([(index, metric_row(by_rank), when) for index, by_rank, when in batch])
            except Exception as exc:  # noqa: BLE001 - retried by the log, unless refused for good
                if not (isinstance(exc, Rejected) or self.permanent(exc)):
                    raise
                self._pop(len(batch))
                with self._rows_lock:
                    more = self._drain_queued = bool(self._rows)
                if more:
                    self.log.submit(self._drain, label="metrics", force=True)
                raise
            self._pop(len(batch))

    def _pop(self, count: int) -> None:
        with self._rows_lock:
            for _ in range(count):
                self._rows.popleft()


def _local_path(url: str) -> Optional[str]:
    """The local path of a checkpoint's URL (None on remote storage: only a reference is logged)."""
    try:
        fs, path = resolve(url)
    except Exception:  # noqa: BLE001 - an unknown protocol: a reference only
        return None
    return path if is_local(fs) else None


def check_installed(kind: str) -> None:
    """Raise ``ImportError`` naming the extra to install when the tracker's library is missing (found without
    importing it)."""
    if importlib.util.find_spec(kind) is None:
        raise ImportError(f"{kind} is not installed: pip install 'raytrain_nb[{kind}]'", name=kind)


def open_tracker(spec: TrackerSpec, run_url: str, run_name: str,
                 params: Optional[Mapping[str, Any]] = None) -> Tracker:
    """A started :class:`Tracker` of ``spec`` for the run at ``run_url`` (nothing waits: it opens in the
    background).

    Raises:
        ImportError: the tracker's library is not installed (naming the extra).
    """
    check_installed(spec.kind)
    tracker = Tracker(spec.backend(), run_url, run_name)
    tracker.start(params)
    return tracker
