"""Worker-side API, named as in Ray Train: ``report``, ``get_context``, ``get_checkpoint``.

These functions are called by user code running on a worker (in a notebook
cell or in a trainer's loop). They never import torch.
"""
from __future__ import annotations

import collections
import dataclasses
import threading
import time
from typing import Any, Callable, Deque, Dict, List, Optional

from ..validate import not_supported
from .report_api import CheckpointUploadMode, check_report_options


@dataclasses.dataclass(frozen=True)
class TrainContext:
    """Where this worker stands in the group (Ray Train's ``TrainContext``)."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str = ""

    def get_world_rank(self) -> int:
        """This worker's rank in the group, 0..world_size-1."""
        return self.world_rank

    def get_world_size(self) -> int:
        """Number of workers in the group."""
        return self.world_size

    def get_local_rank(self) -> int:
        """This worker's rank among the workers on its node."""
        return self.local_rank

    def get_local_world_size(self) -> int:
        """Number of workers on this worker's node."""
        return self.local_world_size

    def get_node_rank(self) -> int:
        """Index of this worker's node among the group's nodes."""
        return self.node_rank

    def get_experiment_name(self) -> str:
        """The run's name."""
        return self.experiment_name

    def get_trial_name(self) -> str:
        """The run's name (Ray Train V2 refuses this Tune-era method; here it names the run)."""
        return self.experiment_name

    def get_metadata(self) -> Dict[str, Any]:
        """The trainer's ``metadata=`` dict (``{}`` in a notebook cell); Ray Train V2 refuses this method."""
        sess = current_session()
        return dict(sess.metadata) if sess is not None else {}

    def get_storage(self) -> Any:
        """Ray Train's ``StorageContext`` (a developer API): not supported.

        Raises:
            NotSupportedError: naming where the run's files are.
        """
        raise not_supported("get_context().get_storage() (Ray Train's StorageContext)", "the run directory is "
                            "<storage_path>/<name> of the RunConfig; pass what the loop needs in train_loop_config")

    def get_trial_id(self) -> str:
        """A Ray Tune trial's id: refused, as Ray Train V2 does.

        Raises:
            NotSupportedError: naming ``train_loop_config``.
        """
        raise not_supported("get_context().get_trial_id()", TRIAL_HINT)

    def get_trial_dir(self) -> str:
        """A Ray Tune trial's directory: refused, as Ray Train V2 does.

        Raises:
            NotSupportedError: naming ``train_loop_config``.
        """
        raise not_supported("get_context().get_trial_dir()", TRIAL_HINT)

    def get_trial_resources(self) -> Any:
        """A Ray Tune trial's resources: refused, as Ray Train V2 does.

        Raises:
            NotSupportedError: naming ``train_loop_config``.
        """
        raise not_supported("get_context().get_trial_resources()", TRIAL_HINT)


#: The way out of Tune's trial methods on a worker (Ray Train V2's advice).
TRIAL_HINT = ("a trainer's workers are not a Tune trial; pass what the loop needs (a directory, the resources) in "
              "train_loop_config")
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
        #: set by the worker: ``upload(index, checkpoint, metrics)``, ``report_name(index) -> name`` and
        #: ``latest() -> Checkpoint|None``
        self.upload: Optional[Callable[[int, Any, Dict[str, Any]], None]] = None
        self.report_name: Optional[Callable[[int], str]] = None
        self.latest: Optional[Callable[[], Any]] = None
        #: set by local mode (``ScalingConfig(num_workers=0)``): the trainer's own process, not a worker
        self.local = False
        #: the trainer's ``metadata=`` while its loop runs (``get_context().get_metadata()``)
        self.metadata: Dict[str, Any] = {}

    @property
    def history(self) -> int:
        """How many records wait for the driver at most (the newest are kept)."""
        return self._pending.maxlen or 0

    def report(self, metrics: Dict[str, Any], total: Optional[int] = None, checkpoint: Any = None) -> None:
        """Queue one report record for the driver (uploading ``checkpoint`` first), then call ``on_report``."""
        if not isinstance(metrics, dict):
            raise TypeError(f"report() takes a dict of metrics, got {type(metrics).__name__}: "
                            "call report({'loss': loss}) ")
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

    def drain(self) -> List[Dict[str, Any]]:
        """The records queued since the last drain, oldest first."""
        with self._lock:
            out = list(self._pending)
            self._pending.clear()
            return out


_session: Optional[WorkerSession] = None


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
    """Report metrics from a worker; they reach the driver within 300 ms.

    Never blocks training: the record is queued and the driver collects it.

    Args:
        metrics: a dict of numbers (1-element tensors are converted).
        checkpoint: a ``Checkpoint`` to save with these metrics.
        checkpoint_dir_name, checkpoint_upload_fn, validation: Ray Train options that are refused when set
            (checkpoints are named by their report index, uploaded into the run, validated in the loop).
        checkpoint_upload_mode: only ``CheckpointUploadMode.SYNC`` (the upload is done when ``report`` returns).
        delete_local_checkpoint_after_upload: ``True`` deletes the checkpoint's local directory once uploaded.
        total: the total number of steps, for progress bars (not in Ray Train).

    With a ``checkpoint`` (``Checkpoint.from_directory(tmpdir)``), this rank's
    files are uploaded into the run's next checkpoint directory before
    ``report`` returns; files from several ranks merge into one checkpoint,
    committed once every rank reported; rank 0's metrics are attached to it.
    Every rank must call ``report`` the same number of times.

    Raises:
        NotSupportedError: a Ray Train option that cannot be honoured, naming it.
    """
    if (checkpoint_dir_name is not None or checkpoint_upload_mode is not CheckpointUploadMode.SYNC
            or checkpoint_upload_fn is not None or validation is not False):  # the step path: one look at defaults
        check_report_options(checkpoint_dir_name, checkpoint_upload_mode, checkpoint_upload_fn, validation)
    session = _get_session("report")
    session.report(metrics, total=total, checkpoint=checkpoint)
    if checkpoint is not None and delete_local_checkpoint_after_upload:
        from ..checkpoint.checkpoint import delete_local  # fsspec: loaded with checkpoints, not on import raytrain_nb

        delete_local(checkpoint)


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
