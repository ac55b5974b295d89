"""What a tracker logs of a report and of a config: numbers from rank 0 (and the mean over ranks where they
differ), flat parameters; and the grouping of a group's per-rank records into reports, in index order."""
from __future__ import annotations

import math
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence

from ..checkpoint.reported import report_index

#: The suffix of a metric's mean over the ranks (``loss/mean``), logged where the ranks' values differ.
MEAN_SUFFIX = "/mean"
#: Longest parameter value logged (MLflow keeps 6000 characters).
MAX_PARAM_CHARS = 500


def flatten(values: Mapping[str, Any], prefix: str = "") -> Dict[str, Any]:
    """Nested dicts as ``outer/inner`` keys (as Ray's trackers flatten them)."""
    out: Dict[str, Any] = {}
    for key, value in values.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(flatten(value, f"{name}/"))
        else:
            out[name] = value
    return out


def _number(value: Any) -> Optional[float]:
    """A finite number as a float (bools as 0/1); None for anything else."""
    if isinstance(value, (bool, int, float)):
        number = float(value)
        return number if math.isfinite(number) else None
    return None


def metric_row(metrics_by_rank: Sequence[Mapping[str, Any]]) -> Dict[str, float]:
    """Rank 0's numbers, and ``<key>/mean`` over the ranks where their numbers differ (as the progress line
    shows them). Strings, non-finite numbers and other values are left out."""
    if not metrics_by_rank:
        return {}
    flat = [flatten(m) for m in metrics_by_rank]
    row: Dict[str, float] = {}
    for key, value in flat[0].items():
        number = _number(value)
        if number is None:
            continue
        row[key] = number
        values = [_number(m.get(key)) for m in flat]
        if len(values) > 1 and None not in values and len(set(values)) > 1:
            row[key + MEAN_SUFFIX] = sum(values) / len(values)  # type: ignore[arg-type]
    return row


def plain_params(values: Optional[Mapping[str, Any]]) -> Dict[str, Any]:
    """The plain values of a config (numbers, strings, None, short lists of them), flattened; objects (a model,
    a tensor, a function) and long values are left out."""
    out: Dict[str, Any] = {}
    for key, value in flatten(values or {}).items():
        if isinstance(value, (list, tuple)) and all(isinstance(v, (bool, int, float, str, type(None))) for v in value):
            value = list(value)
        elif not isinstance(value, (bool, int, float, str, type(None))):
            continue
        if len(str(value)) <= MAX_PARAM_CHARS:
            out[str(key)] = value
    return out


class ReportGrouper:
    """Gathers a group's records (one per rank and report) into reports, handed on in index order.

    A report goes on once every rank of ``world_size()`` reported it, or when a later one does, or at
    :meth:`flush` (the cell ended: ranks that never reported it are gone, or the cell ran on some ranks only).
    Reports without rank 0's record are not handed on (what is logged is rank 0's). ``emit(index,
    metrics_by_rank, time, report_name_with_checkpoint_or_None)``.
    """

    def __init__(self, world_size: Callable[[], int], emit: Callable[[int, List[Dict[str, Any]], float,
                                                                          Optional[str]], None]) -> None:
        self.world_size = world_size
        self.emit = emit
        self._pending: Dict[int, Dict[int, Dict[str, Any]]] = {}

    def on_records(self, records: Iterable[Mapping[str, Any]]) -> None:
        complete = -1
        for rec in records:
            name = rec.get("report")
            index = report_index(name) if isinstance(name, str) else None
            if index is None:
                continue
            ranks = self._pending.setdefault(index, {})
            ranks[int(rec["rank"])] = rec
            if len(ranks) >= self.world_size():
                complete = max(complete, index)
        if complete >= 0:
            self._hand_on(complete)

    def flush(self) -> None:
        """Hand on every report waiting (the cell ended)."""
        if self._pending:
            self._hand_on(max(self._pending))

    def _hand_on(self, upto: int) -> None:
        for index in sorted(i for i in self._pending if i <= upto):
            ranks = self._pending.pop(index)
            if 0 not in ranks:
                continue
            ordered = [ranks[r] for r in sorted(ranks)]
            checkpoint = ranks[0].get("report") if any(r.get("checkpoint") for r in ordered) else None
            self.emit(index, [r["metrics"] for r in ordered], float(ranks[0].get("time") or 0.0), checkpoint)

