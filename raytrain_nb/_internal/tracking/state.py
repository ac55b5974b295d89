"""The tracked runs of a run directory: ``<run>/tracking.json`` names, per tracker and destination, its run id.

So a restart, a resume, a trainer made again with the same ``RunConfig(name)`` and a new kernel on the same run
all log into the same tracked run. The file lives in storage, which is not trusted: an entry that is not a JSON
object of strings is dropped with a warning (a new tracked run is started for it), never used.
"""
from __future__ import annotations

import logging
import threading
from typing import Any, Dict

from ..checkpoint.storage import join, read_json, resolve, to_json, write_bytes_atomic
from ..errors import StorageError

logger = logging.getLogger(__name__)

STATE_FILE = "tracking.json"
_lock = threading.Lock()  # one read-modify-write at a time in this process (the run's lease: one process)


def read_state(run_url: str) -> Dict[str, Dict[str, Any]]:
    """Every good entry of the run's ``tracking.json`` (``{}`` when there is none or it is damaged)."""
    fs, run = resolve(run_url)
    path = join(run, STATE_FILE)
    try:
        data = read_json(fs, path, "the tracking state", missing_ok=True)
    except StorageError as exc:
        logger.warning("%s; a new tracked run is started", exc)
        return {}
    if data is None:
        return {}
    if not isinstance(data, dict):
        logger.warning("%s/%s is not a JSON object: ignored (a new tracked run is started)", run_url, STATE_FILE)
        return {}
    good = {}
    for key, entry in data.items():
        if isinstance(entry, dict) and all(isinstance(v, (str, int, float, list)) for v in entry.values()):
            good[key] = entry
        else:
            logger.warning("%s/%s: entry %r is malformed: ignored", run_url, STATE_FILE, key)
    return good


def remember(run_url: str, key: str, entry: Dict[str, Any]) -> None:
    """Store ``entry`` under ``key`` (merged into what is there), replacing the file in one step."""
    with _lock:
        state = read_state(run_url)
        state[key] = {**state.get(key, {}), **entry}
        fs, run = resolve(run_url)
        write_bytes_atomic(fs, join(run, STATE_FILE), to_json(state, "tracking state", indent=1).encode("utf-8"))


def lookup(run_url: str, key: str) -> Dict[str, Any]:
    """The entry stored under ``key`` (``{}`` when none)."""
    return dict(read_state(run_url).get(key, {}))

