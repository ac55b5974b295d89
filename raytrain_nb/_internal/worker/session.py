"""Worker-side API, named as in Ray Train: ``report``, ``get_context``, ``get_checkpoint``.

These functions are called by user code running on a worker (in a notebook
cell or in a trainer's loop). They never import torch.
"""
from __future__ import annotations

import collections
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional

from .context import METADATA, TRIAL_HINT, TrainContext  # noqa: F401 - re-exported: the worker API lives here
from .report_api import (CheckpointConsistencyMode, CheckpointUploadMode, ReportedCheckpoint, ReportOptions,
                         report_options)


#: The dataset ``get_dataset_shard()`` returns without a name (Ray Train's ``TRAIN_DATASET_KEY``).
TRAIN_DATASET_KEY = "train"


#: Metric types kept as they are without a look for ``.item`` (exact types: a subclass takes the slow path).
_PLAIN_TYPES = frozenset((float, int, bool, str, type(None)))


def _plain(value: Any) -> Any:
    """A reported value as a plain Python number where it is a 1-element tensor/array."""
    item = getattr(value, "item", None)
    if item is not None and callable(item):
        try:
            return item()
        except (ValueError, RuntimeError, TypeError):
            return value
    return value


def plain_metrics(metrics: Dict[str, Any]) -> Dict[str, Any]:
    """``metrics`` with string keys and plain values (:func:`_plain`); plain numbers skip the look-up."""
    out: Dict[str, Any] = {}
    for key, value in metrics.items():
        out[key if type(key) is str else str(key)] = value if type(value) in _PLAIN_TYPES else _plain(value)
    return out


class WorkerSession:
    """Per-process state the worker-side API reads; set up by the worker actor.

    ``report()`` is on the training step's path: it queues one record under a short lock and calls
    the worker's hooks, nothing that waits (the driver drains the queue on its poll).
    """

    def __init__(self, context: TrainContext, history: int = 10_000) -> None:
        self.context = context
        self._lock = threading.Lock()
        self._pending: Deque[Dict[str, Any]] = collections.deque(maxlen=history)  # full: the oldest goes
        self._seq = 0
        self.reports_this_cell = 0
        #: set by the worker: ``on_report(index)`` after the ``index``-th report of the cell is queued
        #: (it records the report where a crash leaves it, before ``report`` returns)
        self.on_report: Optional[Callable[[int], None]] = None
        #: set by the worker while shards are mirrored every K reports: ``on_step(index)`` on the training thread
        self.on_step: Optional[Callable[[int], None]] = None
        #: set by the worker: ``upload(index, checkpoint, metrics)``, ``report_name(index) -> name`` and
        #: ``latest() -> Checkpoint|None``
        self.upload: Optional[Callable[[int, Any, Dict[str, Any]], None]] = None
        self.report_name: Optional[Callable[[int], str]] = None
        self.latest: Optional[Callable[[], Any]] = None
        #: set by the worker: ``prepare_upload(index, checkpoint, metrics, options) -> job`` checks a report's
        #: options now and returns the upload to run (``job() -> record fields``); the background uploads'
        #: queue; ``reported(consistency_mode, timeout_s)`` for ``get_all_reported_checkpoints``
        self.prepare_upload: Optional[Callable[[int, Any, Dict[str, Any], Any], Callable[[], Dict[str, Any]]]] = None
        self.uploads: Any = None
        self.reported: Optional[Callable[[Any, Optional[float]], List[Any]]] = None
        #: set by the driver: the trainer or group has a validation function (``report(validation=...)``)
        self.has_validation = False
        #: set by local mode (``ScalingConfig(num_workers=0)``): the trainer's own process, not a worker
        self.local = False
        #: the trainer's ``metadata=`` while its loop runs (``get_context().get_metadata()``)
        self.metadata: Dict[str, Any] = {}

    @property
    def history(self) -> int:
        """How many records wait for the driver at most (the newest are kept)."""
        return self._pending.maxlen or 0

    def report(self, metrics: Dict[str, Any], total: Optional[int] = None, checkpoint: Any = None,
               options: Any = None) -> None:
        """Queue one report record for the driver (uploading ``checkpoint`` first), then call ``on_report``.

        With ``options`` (a ``ReportOptions``), or while background uploads are pending, the report takes the
        ordered path (:meth:`_report_ordered`).
        """
        if not isinstance(metrics, dict):
            raise TypeError(f"report() takes a dict of metrics, got {type(metrics).__name__}: "
                            "call report({'loss': loss}) ")
        if options is not None or (self.uploads is not None and self.uploads.busy()):
            return self._report_ordered(metrics, total, checkpoint, options)
        index = self.reports_this_cell
        record = {"rank": self.context.world_rank, "time": time.time(), "metrics": plain_metrics(metrics)}
        if total is not None:
            record["total"] = int(total)
        if self.report_name is not None:
            record["report"] = self.report_name(index)
        if checkpoint is not None:
            if self.upload is None:
                raise RuntimeError("report(checkpoint=...) needs a run directory: this worker has no storage")
            self.upload(index, checkpoint, record["metrics"])
            record["checkpoint"] = True
        with self._lock:
            self._seq += 1
            record["seq"] = self._seq
            self._pending.append(record)
            self.reports_this_cell += 1
        if self.on_report is not None:
            self.on_report(index)
        if self.on_step is not None:
            self.on_step(index)

    def _report_ordered(self, metrics: Dict[str, Any], total: Optional[int], checkpoint: Any, options: Any) -> None:
        """A report after (or as) a background upload: its record goes out in report order, after its upload.

        The options are checked and the upload prepared now (errors here, in the caller's line); the upload, the
        record and the ledger entry (``on_report(index, ledger_only=True)``) follow on the uploads' thread for
        ``ASYNC``, or here once every earlier upload is done.
        """
        with self._lock:
            index = self.reports_this_cell
            self.reports_this_cell += 1
        record = {"rank": self.context.world_rank, "time": time.time(), "metrics": plain_metrics(metrics)}
        if total is not None:
            record["total"] = int(total)
        if self.report_name is not None:
            record["report"] = self.report_name(index)
        job = None
        if checkpoint is not None:
            if self.prepare_upload is None:
                if self.upload is None:
                    raise RuntimeError("report(checkpoint=...) needs a run directory: this worker has no storage")
                self.upload(index, checkpoint, record["metrics"])  # local mode: kept at once
                record["checkpoint"] = True
                if options is not None and options.delete_local:
                    from ..checkpoint.checkpoint import delete_local  # fsspec: loaded with checkpoints

                    delete_local(checkpoint)
            else:
                job = self.prepare_upload(index, checkpoint, record["metrics"], options)
        if options is not None and options.validation is not None and checkpoint is not None:
            record["validation"] = options.validation

        def send() -> None:
            if job is not None:
                record.update(job(), checkpoint=True)
            with self._lock:
                self._seq += 1
                record["seq"] = self._seq
                self._pending.append(record)
            if self.on_report is not None:
                self.on_report(index, ledger_only=True)

        asynchronous = options is not None and options.mode.value == "ASYNC" and job is not None
        if self.uploads is None:
            send()
        elif asynchronous or (job is None and self.uploads.busy()):
            self.uploads.submit(send, record.get("report", "") if job is not None else "")
        elif self.uploads.busy():
            self.uploads.submit(send, record.get("report", "")).result()  # SYNC: after the earlier ones, then done
        else:
            send()
        if self.on_report is not None:
            self.on_report(index, step_only=True)
        if self.on_step is not None:
            self.on_step(index)

    def drain(self) -> List[Dict[str, Any]]:
        """The records queued since the last drain, oldest first."""
        with self._lock:
            out = list(self._pending)
            self._pending.clear()
            return out


_session: Optional[WorkerSession] = None


def _metadata() -> Dict[str, Any]:
    return dict(_session.metadata) if _session is not None else {}


METADATA[0] = _metadata  # get_context().get_metadata() reads the session's


def set_session(session: Optional[WorkerSession]) -> None:
    global _session
    _session = session


def current_session() -> Optional[WorkerSession]:
    """This worker's session, or None outside a worker (a driver, a Tune trial's own process)."""
    return _session


def _get_session(fn: str) -> WorkerSession:
    if _session is None:
        raise RuntimeError(
            f"raytrain_nb.{fn}() works only on a worker: call it inside a %%distributed cell, "
            "a WorkerGroup.run/execute, or a trainer's train_loop_per_worker"
        )
    return _session


def get_context() -> TrainContext:
    """The calling worker's :class:`TrainContext` (rank, world size, node rank...).

    Example:
        >>> ctx = raytrain_nb.get_context()          # doctest: +SKIP
        >>> ctx.get_world_rank(), ctx.get_world_size()  # doctest: +SKIP
        (0, 2)
    """
    return _get_session("get_context").context


def report(metrics: Dict[str, Any], checkpoint: Any = None, checkpoint_dir_name: Optional[str] = None,
           checkpoint_upload_mode: CheckpointUploadMode = CheckpointUploadMode.SYNC,
           delete_local_checkpoint_after_upload: Optional[bool] = None,
           checkpoint_upload_fn: Optional[Callable[[Any, str], Any]] = None, validation: Any = False, *,
           total: Optional[int] = None) -> None:
    """Report metrics from a worker; they reach the driver within 300 ms (Ray Train's ``report``).

    Never blocks training without a checkpoint: the record is queued and the driver collects it.

    Args:
        metrics: a dict of numbers (1-element tensors are converted).
        checkpoint: a ``Checkpoint`` to save with these metrics: each rank's files are merged into one
            checkpoint, committed once every rank reported it; rank 0's metrics are attached to it.
        checkpoint_dir_name: the committed directory's name in the run (rank 0's is used; default
            ``checkpoint_NNNNNN`` by report index); a name used already in the run is an error.
        checkpoint_upload_mode: ``SYNC`` uploads before returning; ``ASYNC`` returns at once and uploads in the
            background, one at a time in report order (a failure is raised into the training thread);
            ``NO_UPLOAD``: the checkpoint is a directory already written directly inside the run directory.
        delete_local_checkpoint_after_upload: delete the checkpoint's local directory once uploaded (default:
            only for ``ASYNC``); refused when that directory holds the run directory.
        checkpoint_upload_fn: ``fn(checkpoint, dir_name) -> Checkpoint`` uploads it instead; what it returns must
            be a directory directly inside the run directory.
        validation: ``True`` or a ``ValidationTaskConfig``: validate the checkpoint with the trainer's (or
            group's) ``ValidationConfig`` in a Ray task of its own; its metrics join the checkpoint's.
        total: the total number of steps, for progress bars (not in Ray Train).

    Every rank must call ``report`` the same number of times.

    Raises:
        ValueError: a bad option, in one line naming it (an unknown mode, a name used already, a validation
            without a checkpoint or without a validation config, a checkpoint outside the run).
    """
    session = _get_session("report")
    if (checkpoint_dir_name is not None or checkpoint_upload_mode is not CheckpointUploadMode.SYNC
            or checkpoint_upload_fn is not None or validation is not False
            or delete_local_checkpoint_after_upload):  # the step path: one look at the defaults
        options = report_options(checkpoint, checkpoint_dir_name, checkpoint_upload_mode,
                                 delete_local_checkpoint_after_upload, checkpoint_upload_fn, validation,
                                 session.has_validation or session.local)
        session.report(metrics, total=total, checkpoint=checkpoint, options=options)
        return
    session.report(metrics, total=total, checkpoint=checkpoint)


def get_all_reported_checkpoints(consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
                                 timeout_s: Optional[float] = None) -> List[ReportedCheckpoint]:
    """Every checkpoint the run reported and kept so far, with its metrics and status (Ray Train's).

    First waits for this rank's reports to be committed (``COMMITTED``) and, by default (``VALIDATED``), for
    their pending validations; ``timeout_s`` bounds the wait (None: no bound), after which what there is is
    returned. In local mode (``num_workers=0``) it returns ``[]``, as Ray Train's does.

    Example:
        >>> for rc in raytrain_nb.get_all_reported_checkpoints():   # doctest: +SKIP
        ...     print(rc.checkpoint.path, rc.metrics, rc.status)
    """
    session = _get_session("get_all_reported_checkpoints")
    if not isinstance(consistency_mode, CheckpointConsistencyMode):
        value = getattr(consistency_mode, "value", None)
        if value not in CheckpointConsistencyMode.__members__:
            raise ValueError(f"get_all_reported_checkpoints(consistency_mode={consistency_mode!r}) is not a mode: "
                             "pass CheckpointConsistencyMode.COMMITTED or .VALIDATED")
        consistency_mode = CheckpointConsistencyMode[value]
    if session.local or session.reported is None:
        return []
    return session.reported(consistency_mode, timeout_s)


def get_checkpoint() -> Any:
    """The newest committed checkpoint reported in this run, or ``None`` (none exist yet).

    Example:
        >>> ckpt = raytrain_nb.get_checkpoint()     # doctest: +SKIP
        >>> if ckpt:
        ...     with ckpt.as_directory() as d:
        ...         model.load_state_dict(torch.load(os.path.join(d, "model.pt")))
    """
    session = _get_session("get_checkpoint")
    return session.latest() if session.latest is not None else None


def get_dataset_shard(dataset_name: Optional[str] = None) -> Any:
    """This worker's shard of a dataset given to the trainer (``datasets=``) or ``group.attach_datasets``.

    Args:
        dataset_name: the dataset's name; None: ``"train"`` (``TRAIN_DATASET_KEY``).

    Returns:
        A Ray Data ``DataIterator`` (``iter_torch_batches``, ``iter_batches``).

    Raises:
        KeyError: no dataset of that name (naming those that exist).
    """
    _get_session("get_dataset_shard")
    return _shard(TRAIN_DATASET_KEY if dataset_name is None else dataset_name)


# -- Ray Data shards, set by the driver (group.attach_datasets, TorchTrainer(datasets=...)) ---------

#: On a worker: dataset name -> this rank's DataIterator.
_SHARDS: Dict[str, Any] = {}


def _shard(name: str) -> Any:
    """This worker's iterator for dataset ``name`` (see ``raytrain_nb.get_dataset_shard``).

    Raises:
        KeyError: no dataset of that name was given, naming the ones that were.
    """
    if name not in _SHARDS:
        have = f"the datasets given are {', '.join(sorted(_SHARDS))}" if _SHARDS else \
            "no datasets were given: pass datasets={'train': ds} to the trainer, or group.attach_datasets(train=ds)"
        raise KeyError(f"get_dataset_shard({name!r}): no dataset named {name!r}; {have}")
    return _SHARDS[name]


def dataset_shards() -> Dict[str, Any]:
    """This worker's dataset iterators, by name (a new rank gets its own, never a peer's)."""
    return dict(_SHARDS)


def replace_shards(shards: Dict[str, Any]) -> None:
    """Make ``shards`` this process's datasets, by name (local mode: the trainer's, then what was there before)."""
    _SHARDS.clear()
    _SHARDS.update(shards)


def set_shards(per_rank: List[Dict[str, Any]]) -> List[str]:
    """On each worker: keep this rank's iterators (the same list goes to every rank)."""
    rank = get_context().get_world_rank()
    _SHARDS.clear()
    _SHARDS.update(per_rank[rank])
    return sorted(_SHARDS)
