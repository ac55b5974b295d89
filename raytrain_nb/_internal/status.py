"""Plain-text rendering of a group's status table."""
from __future__ import annotations

from typing import Any, Dict, Sequence


def _metrics(m: Dict[str, Any], limit: int = 60) -> str:
    parts = []
    for key, value in m.items():
        parts.append(f"{key}={value:.4g}" if isinstance(value, float) else f"{key}={value}")
    text = " ".join(parts)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def format_status(rows: Sequence[Any]) -> str:
    """A fixed-width table of :class:`WorkerStatus` rows."""
    header = ("rank", "node", "pid", "device", "state", "last metrics")
    table = [header] + [
        (str(r.rank), r.node, str(r.pid), r.device, r.state + (f" ({r.error})" if r.error and r.state == "dead" else ""),
         _metrics(r.last_metrics))
        for r in rows
    ]
    widths = [max(len(row[i]) for row in table) for i in range(len(header) - 1)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:-1], widths)) + "  " + row[-1] for row in table]
    return "\n".join(line.rstrip() for line in lines)
