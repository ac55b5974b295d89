"""Plain-text rendering of a group's status table."""
from __future__ import annotations

import time as _time
from typing import Any, Dict, Sequence

from .vitals import resources_text, step_text


def _metrics(m: Dict[str, Any], limit: int = 60) -> str:
    parts = []
    for key, value in m.items():
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_status(rows: Sequence[Any]) -> str:
    """A fixed-width table of :class:`WorkerStatus` rows."""
    header = ("rank", "node", "pid", "device", "state", "resources", "step", "last metrics")
    table = [header] + [
        (str(r.rank), r.node, str(r.pid), r.device + (f" {r.shard}" if getattr(r, "shard", "") else ""), r.state + (f" ({r.error})" if r.error and r.state == "dead" else ""),
         resources_text(getattr(r, "resources", {})) or "-",
         step_text(getattr(r, "step_time", None), getattr(r, "slow", False)) or "-", _metrics(r.last_metrics))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in table]
    return "\n".join(line.rstrip() for line in lines)


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def format_checkpoints(entries: Sequence[Any]) -> str:
    """A table of a run's checkpoints: name, kind, time, step, metrics, size."""

    if not entries:
        return "no checkpoints yet: %dist_checkpoint takes a snapshot"
    header = ("name", "kind", "time", "step", "size", "metrics")
    rows = [header] + [
        (e.name, e.kind, _time.strftime("%Y-%m-%d %H:%M:%S", _time.localtime(e.time)),
         "" if e.step is None else str(e.step), _size(e.size_bytes or 0), _metrics(e.metrics or {}))
        for e in entries
    ]
    widths = [max(len(r[i]) for r in rows) for i in range(len(header) - 1)]
    return "\n".join(("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1]).rstrip() for r in rows)


def format_history(records: Sequence[Any]) -> str:
    """The cells that ran without error: id, setup or training, first line."""
    if not records:
        return "no cells ran on the whole group yet"
    lines = ["cell  kind      reports  first line"]
    for r in records:
        first = next((l for l in r.source.splitlines() if l.strip()), "")[:70]
        lines.append(f"{r.cell_id:<4}  {'setup' if r.setup else 'training':<8}  {r.reports:<7}  {first}")
    return "\n".join(lines)
