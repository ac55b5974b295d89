"""What each dashboard button does: one public :class:`~raytrain_nb.WorkerGroup` call (the one its
magic makes), and the line the dashboard shows when it succeeded.

Button  -> method (magic): Checkpoint -> ``checkpoint()`` (``%dist_checkpoint``), Rollback ->
``rollback(name)`` (``%dist_rollback NAME``), Restart dead workers -> ``restart()``
(``%dist_restart``), Rescale to N -> ``rescale(n)`` (``%dist_rescale N``), Interrupt ->
``interrupt()`` (``%dist_interrupt``), Shut down -> ``shutdown()`` (``%dist_shutdown``).
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Dict, List, Optional

from ..._internal.checkpoint.reported import uploads_in_progress
from .model import format_metrics, n_workers

LABELS = {"checkpoint": "Checkpoint", "rollback": "Rollback", "restart": "Restart dead workers",
          "rescale": "Rescale to", "interrupt": "Interrupt", "shutdown": "Shut down"}
ICONS = {"checkpoint": "save", "rollback": "undo", "restart": "refresh", "rescale": "arrows-h",
         "interrupt": "stop", "shutdown": "power-off"}
STYLES = {"checkpoint": "primary", "rollback": "warning", "restart": "success", "rescale": "",
          "interrupt": "", "shutdown": "danger"}


def act(group: Any, name: str, checkpoint: Optional[str] = None, workers: int = 0) -> str:
    """Carry out button ``name`` on ``group``; returns what happened, in one line.

    Raises:
        Whatever the group method raises (the dashboard shows its message).
    """
    if name == "checkpoint":
        entry = group.checkpoint()
        step = "" if entry.step is None else f" at step {entry.step}"
        return f"saved {entry.name}{step} ({entry.size_bytes / 1e6:.1f} MB)"
    if name == "rollback":
        return str(group.rollback(checkpoint))
    if name == "restart":
        ranks = group.restart()
        return f"restarted rank(s) {', '.join(map(str, ranks))}: state copied from a live peer"
    if name == "rescale":
        group.rescale(workers)
        return f"the group has {n_workers(group.num_workers)}"
    if name == "interrupt":
        states = [r.get("state") for r in group.interrupt()]
        if states and all(st in ("idle", "finishing") for st in states):
            return "nothing was interrupted: no rank was running user code (just starting or ending)"
        return "interrupted every rank"
    if name == "shutdown":
        group.shutdown()
        return "the group was shut down"
    raise ValueError(f"unknown button {name!r}: one of {', '.join(LABELS)}")


#: How the list shows a reported checkpoint's validation (``report(validation=...)``).
VALIDATION = {"pending": "validating…", "validated": "validated", "timeout": "validation timed out",
              "failed": "validation failed"}


@dataclasses.dataclass
class Uploading:
    """A row of the checkpoint list for a reported checkpoint still uploading (an ASYNC report): not committed yet."""

    name: str
    kind: str = "reported"  # never rolled back (Rollback takes snapshots)
    step: Optional[int] = None
    metrics: Dict[str, Any] = dataclasses.field(default_factory=dict)
    time: float = 0.0
    uploading: bool = True


def checkpoint_rows(group: Any) -> List[Any]:
    """The run's checkpoints, then the reported ones still uploading, for the list (oldest first)."""
    entries = list(group.checkpoints())
    try:
        pending = uploads_in_progress(group.run_storage.url)
    except Exception:  # noqa: BLE001 - the committed list still shows
        pending = []
    names = {e.name for e in entries}
    return entries + [Uploading(name) for name in pending if name not in names]


def entry_label(e: Any) -> str:
    """``name · kind · step N · metrics · validation · time`` for the checkpoint list (``uploading…`` while it is)."""
    if getattr(e, "uploading", False):
        return f"{e.name} · reported · uploading…"
    parts = [e.name, e.kind]
    if e.step is not None:
        parts.append(f"step {e.step}")
    metrics = format_metrics(e.metrics or {}, limit=40)
    if metrics:
        parts.append(metrics)
    status = (getattr(e, "validation", None) or {}).get("status")
    if status in VALIDATION:
        parts.append(VALIDATION[status])
    parts.append(time.strftime("%H:%M:%S", time.localtime(e.time)))
    return " · ".join(parts)


def show_entries(select: Any, entries: List[Any]) -> None:
    """Show ``entries`` in the ``Select`` ``select``, newest first; keep its selection, else select the newest."""
    options = [(entry_label(e), e.name) for e in reversed(entries)]
    if list(select.options) == options:
        return
    current = select.value
    names = [n for _, n in options]
    known = {n for _, n in select.options}
    if any(n not in known for n in names) or current not in names:
        current = names[0] if names else None  # a new checkpoint: select it
    with select.hold_sync():
        select.options = options
        select.value = current
