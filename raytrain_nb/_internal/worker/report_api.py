"""Ray Train V2's names around ``report()``: upload modes, reported checkpoints, validation, preemption notices.

They are shaped as in Ray Train, and ``report()``'s options are checked here (:func:`report_options`) before
anything is uploaded; the uploads are ``checkpointing.py``'s, the background ones ``uploads.py``'s, the
validations the driver's (``group/validations.py``). Preemption notices are refused with a
:class:`NotSupportedError` naming what to do instead.
"""
from __future__ import annotations

import dataclasses
import enum
from typing import Any, Callable, Dict, List, Optional, Protocol

from ..validate import not_supported


class CheckpointUploadMode(enum.Enum):
    """How ``report(checkpoint=...)`` uploads (Ray Train's): ``SYNC`` before it returns, ``ASYNC`` in the background,
    ``NO_UPLOAD`` not at all (the checkpoint is already in the run directory)."""

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
    """Arguments of one validation of a reported checkpoint (Ray Train's): ``fn_kwargs`` override the config's,
    ``timeout_s`` (None: none) is recorded as ``VALIDATION_TIMEOUT`` when it passes."""

    fn_kwargs: Optional[Dict[str, Any]] = None
    timeout_s: Optional[float] = None

    def __post_init__(self) -> None:
        if self.fn_kwargs is None:
            self.fn_kwargs = {}
        if self.timeout_s is not None and (isinstance(self.timeout_s, bool) or not isinstance(self.timeout_s, (
                int, float)) or self.timeout_s <= 0):
            raise ValueError(f"ValidationTaskConfig(timeout_s={self.timeout_s!r}) is not allowed: pass None (no "
                             "timeout) or a number of seconds > 0")


class ValidationFn(Protocol):
    """A function that validates a checkpoint: ``fn(checkpoint, **kwargs) -> metrics`` (Ray Train's)."""

    def __call__(self, checkpoint: Any, **kwargs: Any) -> Dict[str, Any]:
        ...


class ValidationConfig:
    """Validation of reported checkpoints in Ray tasks of their own (Ray Train's): ``report(..., validation=True)``
    runs ``fn(checkpoint, **fn_kwargs)`` apart from the workers, one at a time, in report order; the metrics it
    returns are merged into that checkpoint's. Give it to a trainer (``validation_config=``) or a group
    (``group.validation(fn)``).

    Args:
        fn: the validation function.
        task_config: its default arguments.
        ray_remote_kwargs: options of the Ray task it runs in.
    """

    def __init__(self, fn: ValidationFn, task_config: Optional[ValidationTaskConfig] = None,
                 ray_remote_kwargs: Optional[Dict[str, Any]] = None) -> None:
        if not callable(fn):
            raise ValueError(f"ValidationConfig(fn={fn!r}) is not callable: pass fn(checkpoint, **kwargs) -> dict")
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


def get_preemption_info() -> Optional[PreemptionInfo]:
    """The notice that a node of the run is being preempted (Ray Train's): not supported.

    Raises:
        NotSupportedError: saying how a preempted node's workers are recovered here.
    """
    raise not_supported("get_preemption_info() (node preemption notices)", "a preempted node's workers are lost "
                        "workers, recovered under FailureConfig(max_failures) from the newest checkpoint: report "
                        "checkpoints periodically")


@dataclasses.dataclass(frozen=True)
class ReportOptions:
    """What one ``report()`` asked beyond its metrics and checkpoint, checked (:func:`report_options`)."""

    dir_name: Optional[str] = None
    mode: CheckpointUploadMode = CheckpointUploadMode.SYNC
    delete_local: bool = False
    upload_fn: Optional[Callable[[Any, str], Any]] = None
    #: None, or what the validation task is told: ``{"fn_kwargs": {...}, "timeout_s": ...}`` (None: the config's)
    validation: Optional[Dict[str, Any]] = None


def report_options(checkpoint: Any, checkpoint_dir_name: Optional[str], checkpoint_upload_mode: Any,
                   delete_local_checkpoint_after_upload: Optional[bool], checkpoint_upload_fn: Any,
                   validation: Any, has_validation: bool) -> ReportOptions:
    """Check ``report()``'s Ray Train options, at once, in one line each.

    Raises:
        ValueError: an unknown upload mode, a bad directory name, a validation without a checkpoint or without
            the trainer's (or group's) validation config, an upload function that is not callable.
    """
    from ..checkpoint.storage import is_dir_name  # fsspec: loaded with checkpoints, not on import raytrain_nb

    value = getattr(checkpoint_upload_mode, "value", None)  # Ray's own enum member is taken for ours
    if isinstance(value, str) and value in CheckpointUploadMode.__members__:
        checkpoint_upload_mode = CheckpointUploadMode[value]
    if not isinstance(checkpoint_upload_mode, CheckpointUploadMode):
        raise ValueError(f"report(checkpoint_upload_mode={checkpoint_upload_mode!r}) is not an upload mode: pass "
                         "CheckpointUploadMode.SYNC, .ASYNC or .NO_UPLOAD")
    if checkpoint_dir_name is not None and (not isinstance(checkpoint_dir_name, str) or not is_dir_name(
            checkpoint_dir_name)):
        raise ValueError(f"report(checkpoint_dir_name={checkpoint_dir_name!r}) is not a directory name: use letters, "
                         "digits and _ . = + -, not starting with '.' (like 'epoch_3')")
    if checkpoint_upload_fn is not None and not callable(checkpoint_upload_fn):
        raise ValueError(f"report(checkpoint_upload_fn={checkpoint_upload_fn!r}) is not callable: pass a function "
                         "fn(checkpoint, checkpoint_dir_name) -> Checkpoint")
    spec: Optional[Dict[str, Any]] = None
    if validation is not False and validation is not None:
        if validation is True:
            spec = {"fn_kwargs": None, "timeout_s": None}
        elif isinstance(validation, ValidationTaskConfig):
            spec = {"fn_kwargs": dict(validation.fn_kwargs or {}), "timeout_s": validation.timeout_s}
        else:
            raise ValueError(f"report(validation={validation!r}) is neither a bool nor a ValidationTaskConfig: pass "
                             "validation=True or ValidationTaskConfig(fn_kwargs=..., timeout_s=...)")
        if checkpoint is None:
            raise ValueError("report(validation=...) without a checkpoint: a validation scores a reported "
                             "checkpoint; pass checkpoint= too")
        if not has_validation:
            raise ValueError("report(validation=...) but no validation function was given: pass "
                             "validation_config=ValidationConfig(fn) to the trainer (in a notebook: "
                             "group.validation(fn))")
    delete = (checkpoint_upload_mode.default_delete_local_checkpoint_after_upload()
              if delete_local_checkpoint_after_upload is None else bool(delete_local_checkpoint_after_upload))
    if checkpoint_upload_mode is CheckpointUploadMode.NO_UPLOAD:
        delete = False  # the files are the checkpoint: nothing local to delete
    return ReportOptions(checkpoint_dir_name, checkpoint_upload_mode, delete, checkpoint_upload_fn, spec)
