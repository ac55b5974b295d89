"""What a run's checkpoint index holds: its entries, the kinds and settings, and which runs have one."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional

from fsspec import AbstractFileSystem

from ..errors import CheckpointError
from .checkpoint import Checkpoint
from .storage import join, resolve

INDEX_FILE = "checkpoints.json"
KINDS = ("snapshot", "reported")
SCORE_ORDERS = ("max", "min")
FORMAT = 1
STEP_KEYS = ("step", "training_iteration")


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
    """

    name: str
    kind: str
    path: str
    metrics: Dict[str, Any]
    step: Optional[int]
    time: float
    size_bytes: int
    filesystem: Optional[AbstractFileSystem] = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def checkpoint(self) -> Checkpoint:
        """The :class:`Checkpoint` to load."""
        return Checkpoint(self.path, filesystem=self.filesystem)


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
