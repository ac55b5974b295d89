"""What a run's checkpoint index holds: its entries, the kinds and settings, and which runs have one."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from fsspec import AbstractFileSystem

from ..errors import CheckpointError
from .checkpoint import Checkpoint
from .reported import report_index
from .storage import is_dir_name, join, resolve

INDEX_FILE = "checkpoints.json"
KINDS = ("snapshot", "reported")
SCORE_ORDERS = ("max", "min")
FORMAT = 1
STEP_KEYS = ("step", "training_iteration")
#: What each field of an index entry must hold.
_FIELDS = {"name": lambda v: isinstance(v, str) and v, "kind": lambda v: v in KINDS,
           "path": lambda v: isinstance(v, str) and v, "metrics": lambda v: isinstance(v, dict),
           "step": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool)),
           "time": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
           "size_bytes": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0}


@dataclasses.dataclass
class CheckpointEntry:
    """One checkpoint of a run, as listed in its index.

    Attributes:
        name: the directory name inside the run directory.
        kind: ``"snapshot"`` or ``"reported"``.
        path: the checkpoint's URL (a plain path when local).
        metrics: the metrics reported with it.
        step: ``metrics["step"]`` (or ``training_iteration``) when present.
        time: when it was registered (seconds since the epoch).
        size_bytes: the size of its files.
        report: the report index of a reported checkpoint (its order; None: read from its name, as before).
        validation: a reported checkpoint's validation: ``{"status": "pending"|"validated"|"timeout"|"failed",
            "error": text}``; None when none was asked.
    """

    name: str
    kind: str
    path: str
    metrics: Dict[str, Any]
    step: Optional[int]
    time: float
    size_bytes: int
    report: Optional[int] = None
    validation: Optional[Dict[str, Any]] = None
    filesystem: Optional[AbstractFileSystem] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def checkpoint(self) -> Checkpoint:
        """The :class:`Checkpoint` to load."""
        return Checkpoint(self.path, filesystem=self.filesystem)


def entry_problem(raw: Any) -> Optional[str]:
    """What is wrong with one raw entry of the index (read from storage), or None if it loads.

    Its ``path`` must be the name of a directory directly inside the run: never absolute, with
    ``..``, on another storage (``s3://other-bucket/...``) or nested.
    """
    if not isinstance(raw, dict):
        return "is not an object"
    for field, ok in _FIELDS.items():
        if field not in raw or not ok(raw[field]):
            return f"has {field}={raw.get(field)!r}, which is not valid"
    report = raw.get("report")
    if report is not None and (isinstance(report, bool) or not isinstance(report, int) or report < 0):
        return f"has report={report!r}, which is not valid"
    if raw.get("validation") is not None and not isinstance(raw["validation"], dict):
        return f"has validation={raw['validation']!r}, which is not valid"
    if not is_dir_name(raw["path"]):
        return (f"has path={raw['path']!r}, which is not a directory directly inside the run (absolute, "
                "'..', another storage or nested)")
    return None


def entry_label(i: int, raw: Any) -> str:
    """How a warning names raw entry ``i``: its name when it has one, else its position."""
    name = raw.get("name") if isinstance(raw, dict) else None
    return repr(name) if isinstance(name, str) and name else str(i)


def check_kind(kind: Optional[str], allow_none: bool = True) -> None:
    """Raise unless ``kind`` is a checkpoint kind (or None, where allowed)."""
    if kind is None and allow_none:
        return
    if kind not in KINDS:
        raise CheckpointError(f"kind={kind!r} is unknown: use 'snapshot' or 'reported'")


def check_config(num_to_keep: Any, score_attribute: Any, score_order: Any) -> None:
    """Raise unless the manager settings are valid, naming the bad one and the fix."""
    if num_to_keep is not None and (isinstance(num_to_keep, bool) or not isinstance(num_to_keep, int)
                                    or num_to_keep < 1):
        raise CheckpointError(f"num_to_keep={num_to_keep!r} is not allowed: pass None to keep every "
                              "checkpoint, or a whole number >= 1")
    if score_attribute is not None and (not isinstance(score_attribute, str) or not score_attribute):
        raise CheckpointError(f"score_attribute={score_attribute!r} is not allowed: pass a metric "
                              "name such as 'val_loss', or None to rank by recency")
    if score_order not in SCORE_ORDERS:
        raise CheckpointError(f"score_order={score_order!r} is unknown: use 'max' or 'min'")


def score_of(metrics: Dict[str, Any], attribute: str) -> Any:
    """``metrics[attribute]``, or a nested value for ``"val/acc"``; None when absent."""
    if attribute in metrics:
        return metrics[attribute]
    value: Any = metrics
    for part in attribute.split("/"):  # "val/acc" reaches a nested {"val": {"acc": ...}}
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def list_runs(storage_url: Any, filesystem: Optional[Any] = None) -> List[str]:
    """Names of the run directories under ``storage_url`` that have a checkpoint index."""
    fs, root = resolve(storage_url, filesystem)
    fs.invalidate_cache(root)
    try:
        entries = fs.ls(root, detail=True)
    except (FileNotFoundError, NotADirectoryError):
        return []
    dirs = [e["name"].rstrip("/") for e in entries if e.get("type") == "directory"]
    return sorted(d.rsplit("/", 1)[-1] for d in dirs if fs.exists(join(d, INDEX_FILE)))


def entry_report(entry: CheckpointEntry) -> int:
    """A reported checkpoint's report index: its own, else read from a ``checkpoint_NNNNNN`` name (-1: none)."""
    if entry.report is not None:
        return entry.report
    index = report_index(entry.name)
    return -1 if index is None else index
