"""The run's metric log: every reported metric, one JSON line each, in ``metrics.jsonl``.

Records are appended with or without a checkpoint; a new kernel reads them back with
:func:`read_metrics` without starting a group.

Example::

    append_metrics("~/raytrain_nb_results/r1", {"step": 3, "loss": 0.25, "rank": 0})
    read_metrics("~/raytrain_nb_results/r1")[-1]["loss"]   # -> 0.25
"""
from __future__ import annotations

import json
import logging
from typing import Any, Dict, List, Optional, Union

from ..errors import CheckpointError
from .storage import join, resolve, to_json, to_url

logger = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"


def append_metrics(run_dir_url: Any, record: Union[Dict[str, Any], List[Dict[str, Any]]],
                   filesystem: Optional[Any] = None) -> None:
    """Append one JSON line per record (a dict, or a list of them) to the run's ``metrics.jsonl``.

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
    with fs.open(join(run, METRICS_FILE), "ab") as f:
        f.write(line.encode("utf-8"))


def read_metrics(run_dir_url: Any, filesystem: Optional[Any] = None) -> List[Dict[str, Any]]:
    """Every record of the run's ``metrics.jsonl`` ([] if none).

    A last line cut short by a crash is skipped with a warning.

    Raises:
        CheckpointError: a damaged line before the last, naming the file and line number.
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
            if number == len(lines):  # no newline after it: the write was cut short
                logger.warning("skipping the last line of %s: it was cut short", to_url(fs, path))
                break
            raise CheckpointError(f"metrics file {to_url(fs, path)} line {number} is damaged ({exc}): "
                                  "fix or delete that line") from exc
        records.append(record)
    return records
