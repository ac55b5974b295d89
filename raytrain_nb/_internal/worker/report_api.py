"""Ray Train V2's names around ``report()``: upload modes, reported checkpoints, validation, preemption notices.

They exist as Ray Train shapes them, so a script importing them runs. What they control is checked here:
``report()`` honours the synchronous upload (what it always does) and ``delete_local_checkpoint_after_upload``;
asynchronous and skipped uploads, an upload function, a directory name, validation in tasks of their own,
``get_all_reported_checkpoints()`` and preemption notices are refused with a :class:`NotSupportedError` naming
what to do instead.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Dict, List, Optional, Protocol

from ..validate import not_supported


class CheckpointUploadMode(enum.Enum):
    """How ``report(checkpoint=...)`` uploads (Ray Train's): only ``SYNC`` here, uploaded before it returns."""

    ASYNC = "ASYNC"
    SYNC = "SYNC"
    NO_UPLOAD = "NO_UPLOAD"

    def default_delete_local_checkpoint_after_upload(self) -> bool:
        """Whether ``report`` deletes the local directory after the upload unless told: only for ``ASYNC``."""
        return self is CheckpointUploadMode.ASYNC


class CheckpointConsistencyMode(enum.Enum):
    """Which reported checkpoints ``get_all_reported_checkpoints`` waits for (Ray Train's)."""

    COMMITTED = "COMMITTED"
    VALIDATED = "VALIDATED"


class ReportedCheckpointStatus(enum.Enum):
    """Where a reported checkpoint stands (Ray Train's)."""

    COMMITTED = "COMMITTED"
    PENDING_VALIDATION = "PENDING_VALIDATION"
    VALIDATED = "VALIDATED"
    VALIDATION_TIMEOUT = "VALIDATION_TIMEOUT"
    VALIDATION_FAILED = "VALIDATION_FAILED"


@dataclasses.dataclass
class ReportedCheckpoint:
    """A reported checkpoint with its metrics and status (Ray Train's)."""

    checkpoint: Any
    metrics: Dict[str, Any]
    status: ReportedCheckpointStatus


@dataclasses.dataclass
class ValidationTaskConfig:
    """Arguments of one validation of a reported checkpoint (Ray Train's); ``report(validation=...)`` refuses it."""

    fn_kwargs: Optional[Dict[str, Any]] = None
    timeout_s: Optional[float] = None


class ValidationFn(Protocol):
    """A function that validates a checkpoint: ``fn(checkpoint, **kwargs) -> metrics`` (Ray Train's)."""

    def __call__(self, checkpoint: Any, **kwargs: Any) -> Dict[str, Any]:
        ...


class ValidationConfig:
    """Validation of reported checkpoints in Ray tasks of their own (Ray Train's). It can be built; a trainer given
    one (``validation_config=``) refuses it: validate in the training loop and report the metrics instead.

    Args:
        fn: the validation function.
        task_config: its default arguments.
        ray_remote_kwargs: options of the Ray task it runs in.
    """

    def __init__(self, fn: ValidationFn, task_config: Optional[ValidationTaskConfig] = None,
                 ray_remote_kwargs: Optional[Dict[str, Any]] = None) -> None:
        self.fn = fn
        self.task_config = task_config or ValidationTaskConfig()
        self.ray_remote_kwargs = ray_remote_kwargs or {}

    def __repr__(self) -> str:
        return f"ValidationConfig(fn={getattr(self.fn, '__name__', self.fn)!r}, task_config={self.task_config!r})"


@dataclasses.dataclass
class PreemptionInfo:
    """A notice that nodes of the run are being preempted (Ray Train's); never received here."""

    deadline_ms: Optional[int]
    preempted_node_to_ranks: Dict[str, List[int]]

    @property
    def preempted_node_ids(self) -> List[str]:
        """The preempted nodes' ids, sorted."""
        return sorted(self.preempted_node_to_ranks)

    @property
    def preempted_ranks(self) -> List[int]:
        """Every rank on a preempted node, sorted."""
        return sorted({r for ranks in self.preempted_node_to_ranks.values() for r in ranks})


def get_all_reported_checkpoints(consistency_mode: CheckpointConsistencyMode = CheckpointConsistencyMode.VALIDATED,
                                 timeout_s: Optional[float] = None) -> List[ReportedCheckpoint]:
    """Every checkpoint the run reported so far (Ray Train's): not supported yet.

    Raises:
        NotSupportedError: naming ``get_checkpoint()`` and ``result.best_checkpoints``.
    """
    raise not_supported("get_all_reported_checkpoints()", "get_checkpoint() returns the newest committed checkpoint; "
                        "after fit(), result.best_checkpoints lists the kept ones with their metrics")


def get_preemption_info() -> Optional[PreemptionInfo]:
    """The notice that a node of the run is being preempted (Ray Train's): not supported.

    Raises:
        NotSupportedError: saying how a preempted node's workers are recovered here.
    """
    raise not_supported("get_preemption_info() (node preemption notices)", "a preempted node's workers are lost "
                        "workers, recovered under FailureConfig(max_failures) from the newest checkpoint: report "
                        "checkpoints periodically")


def check_report_options(checkpoint_dir_name: Optional[str], checkpoint_upload_mode: Any,
                         checkpoint_upload_fn: Any, validation: Any) -> None:
    """Refuse the ``report()`` options that cannot be honoured here.

    Raises:
        NotSupportedError: naming the option and what to do instead.
    """
    if checkpoint_dir_name is not None:
        raise not_supported(f"report(checkpoint_dir_name={checkpoint_dir_name!r})", "reported checkpoints are "
                            "named checkpoint_NNNNNN by their report index; drop the argument")
    mode = getattr(checkpoint_upload_mode, "value", checkpoint_upload_mode)
    if mode != CheckpointUploadMode.SYNC.value:
        raise not_supported(f"report(checkpoint_upload_mode={checkpoint_upload_mode!r})", "checkpoints are uploaded "
                            "before report() returns; pass CheckpointUploadMode.SYNC (the default)")
    if checkpoint_upload_fn is not None:
        raise not_supported("report(checkpoint_upload_fn=...)", "the checkpoint's files are uploaded into the run "
                            "directory; drop the argument")
    if validation is not False:
        raise not_supported(f"report(validation={validation!r}) (validation in a task of its own)",
                            "validate in the training loop and report its metrics with the checkpoint")
