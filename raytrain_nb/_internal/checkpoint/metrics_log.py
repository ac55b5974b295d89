"""The run's metric log: every reported metric, one JSON line each, in ``metrics.jsonl``.

Records are appended with or without a checkpoint; a new kernel reads them back with
:func:`read_metrics` without starting a group. The driver adds each report's index under ``_report``
(:data:`REPORT_KEY`), which readers drop: :func:`last_report_index` finds the newest one, so a run reopened
in a new kernel numbers its reports after every report it made, with a checkpoint or without.

Example::

    append_metrics("~/raytrain_nb_results/r1", {"step": 3, "loss": 0.25, "rank": 0})
    read_metrics("~/raytrain_nb_results/r1")[-1]["loss"]   # -> 0.25
"""
from __future__ import annotations

import json
import logging
from typing import Any, Dict, List, Optional, Union

from fsspec import AbstractFileSystem

from ..errors import CheckpointError
from .storage import join, resolve, to_json, to_url

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
#: The key of a line's report index (written by the driver, dropped by :func:`read_metrics`).
REPORT_KEY = "_report"
#: How much of the end of ``metrics.jsonl`` :func:`last_report_index` reads.
TAIL_BYTES = 64 * 1024


def append_metrics(run_dir_url: Any, record: Union[Dict[str, Any], List[Dict[str, Any]]],
                   filesystem: Optional[Any] = None) -> None:
    """Append one JSON line per record (a dict, or a list of them) to the run's ``metrics.jsonl``.

    After a last line that a crash cut short (no newline at its end), the records start on a
    new line, so they are never glued onto the torn one.

    Raises:
        CheckpointError: a record is not a dict or holds a value JSON cannot store.
    """
    records = record if isinstance(record, list) else [record]
    for rec in records:
        if not isinstance(rec, dict):
            raise CheckpointError(f"record={rec!r} is not a dict: pass the reported metrics")
    line = "".join(to_json(rec, "metrics", error=CheckpointError) + "\n" for rec in records)
    fs, run = resolve(run_dir_url, filesystem)
    fs.makedirs(run, exist_ok=True)
    path = join(run, METRICS_FILE)
    if _ends_torn(fs, path):
        logger.warning("%s ends in a line cut short: appending on a new line", to_url(fs, path))
        line = "\n" + line
    with fs.open(path, "ab") as f:
        f.write(line.encode("utf-8"))


def _ends_torn(fs: AbstractFileSystem, path: str) -> bool:
    """Whether the file ``path`` exists, is not empty and does not end in a newline."""
    fs.invalidate_cache(path)
    try:
        size = fs.size(path)
        return bool(size) and fs.cat_file(path, start=size - 1, end=size) != b"\n"
    except FileNotFoundError:
        return False


def read_metrics(run_dir_url: Any, filesystem: Optional[Any] = None) -> List[Dict[str, Any]]:
    """Every good record of the run's ``metrics.jsonl`` ([] if none).

    A damaged line (cut short by a crash, edited, or not a JSON object) is skipped with a
    warning naming the file and the line number, wherever it is: the other records still load.
    """
    fs, run = resolve(run_dir_url, filesystem)
    path = join(run, METRICS_FILE)
    fs.invalidate_cache(path)
    try:
        data = fs.cat_file(path).decode("utf-8", errors="replace")
    except FileNotFoundError:
        return []
    lines = data.split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            if not isinstance(record, dict):
                raise ValueError(f"a {type(record).__name__}, not an object")
        except ValueError as exc:
            why = "it was cut short" if number == len(lines) else f"it is damaged ({exc})"
            logger.warning("metrics file %s line %d skipped: %s; fix or delete that line", to_url(fs, path),
                           number, why)
            continue
        record.pop(REPORT_KEY, None)
        records.append(record)
    return records


def last_report_index(run_dir_url: Any, filesystem: Optional[Any] = None) -> int:
    """The highest report index in the last lines of the run's ``metrics.jsonl`` (0 when none carries one).

    Indices only grow along the file, so the newest line that carries one has the highest; only the file's
    last :data:`TAIL_BYTES` are read (a torn or damaged line is passed over).
    """
    fs, run = resolve(run_dir_url, filesystem)
    path = join(run, METRICS_FILE)
    fs.invalidate_cache(path)
    try:
        size = fs.size(path)
        data = fs.cat_file(path, start=max(0, size - TAIL_BYTES), end=size) if size else b""
    except FileNotFoundError:
        return 0
    for line in reversed(data.decode("utf-8", errors="replace").split("\n")):
        try:
            index = json.loads(line).get(REPORT_KEY) if line.strip() else None
        except (ValueError, AttributeError):
            continue
        if isinstance(index, int) and not isinstance(index, bool):
            return index
    return 0
