"""Prove that the driver and every worker see the same storage (Ray Train's marker-file check).

The driver writes a marker under the run directory; each worker must read it and writes one of
its own, which the driver then reads. A local path on a multi-node cluster fails here, at
start, instead of later when a checkpoint written on one node is looked for on another.

Example::

    token = write_marker(run_url)                                    # driver
    ray.get([w.check.remote(run_url, token, rank) for ...])          # worker: read_marker(...)
    collect_markers(run_url, token, ranks=range(n)); clear_markers(run_url, token)
"""
from __future__ import annotations

import contextlib
import json
import os
import socket
import time
import uuid
from typing import Any, Dict, Iterable, List, Optional

from fsspec import AbstractFileSystem

from ..errors import StorageError, describe, format_ranks
from .storage import is_local, join, resolve, to_url

MARKER_DIR = ".storage_check"
DRIVER_MARKER = "driver.json"


def _hint(fs: AbstractFileSystem) -> str:
    if is_local(fs):
        return ("; a local path on a multi-node cluster is not shared between nodes: use s3://, gs:// "
                "or a shared filesystem (NFS) mounted at the same path on every node")
    return "; check that every node has the same credentials and endpoint for this storage"


def _me() -> Dict[str, Any]:
    return {"host": socket.gethostname(), "pid": os.getpid(), "time": time.time()}


def write_marker(run_url: Any, filesystem: Optional[Any] = None) -> str:
    """Driver side: write the marker workers must find; returns its token.

    Raises:
        StorageError: the marker cannot be written (naming the path and cause).
    """
    fs, run = resolve(run_url, filesystem)
    token = uuid.uuid4().hex
    path = join(run, MARKER_DIR, token, DRIVER_MARKER)
    try:
        fs.makedirs(fs._parent(path), exist_ok=True)
        fs.pipe_file(path, json.dumps({"token": token, **_me()}).encode())
    except Exception as exc:
        raise StorageError(f"cannot write the storage check marker {to_url(fs, path)} "
                           f"({describe(exc)}): pass a writable --storage URL") from exc
    return token


def read_marker(run_url: Any, token: str, *, rank: Optional[int] = None,
                filesystem: Optional[Any] = None) -> Dict[str, Any]:
    """Worker side: read the driver's marker and, with ``rank``, write this rank's own.

    Returns:
        The driver's marker (``token``, ``host``, ``pid``, ``time``).

    Raises:
        StorageError: the marker is not visible here, naming the path, this host and the cause.
    """
    fs, run = resolve(run_url, filesystem)
    path = join(run, MARKER_DIR, token, DRIVER_MARKER)
    where = f" on host {socket.gethostname()}" + (f" (rank {rank})" if rank is not None else "")
    fs.invalidate_cache(fs._parent(path))
    try:
        payload = json.loads(fs.cat_file(path).decode("utf-8"))
        if not isinstance(payload, dict) or payload.get("token") != token:
            raise ValueError("it holds another token")
    except Exception as exc:
        raise StorageError(f"the storage check marker {to_url(fs, path)} written by the driver cannot be "
                           f"read{where} ({describe(exc)}){_hint(fs)}") from exc
    if rank is not None:
        mine = join(run, MARKER_DIR, token, f"rank-{rank}.json")
        try:
            fs.pipe_file(mine, json.dumps({"token": token, "rank": rank, **_me()}).encode())
        except Exception as exc:
            raise StorageError(f"cannot write the storage check marker {to_url(fs, mine)}{where} "
                               f"({describe(exc)}): the storage must be writable from every worker") from exc
    return payload


def collect_markers(run_url: Any, token: str, ranks: Iterable[int],
                    filesystem: Optional[Any] = None) -> Dict[int, Dict[str, Any]]:
    """Driver side: read every rank's marker.

    Returns:
        ``{rank: marker}`` (each with the worker's ``host`` and ``pid``).

    Raises:
        StorageError: some ranks' markers are not visible, naming them, the path and the cause.
    """
    fs, run = resolve(run_url, filesystem)
    folder = join(run, MARKER_DIR, token)
    fs.invalidate_cache(folder)
    found: Dict[int, Dict[str, Any]] = {}
    missing: List[int] = []
    cause = ""
    for rank in ranks:
        try:
            found[rank] = json.loads(fs.cat_file(join(folder, f"rank-{rank}.json")).decode("utf-8"))
        except Exception as exc:
            missing.append(rank)
            cause = cause or describe(exc)
    if missing:
        raise StorageError(f"the driver on host {socket.gethostname()} cannot read the storage check "
                           f"markers of {format_ranks(missing)} under {to_url(fs, folder)} ({cause})"
                           f"{_hint(fs)}")
    return found


def clear_markers(run_url: Any, token: str, filesystem: Optional[Any] = None) -> None:
    """Remove the markers of one check (missing ones are fine)."""
    fs, run = resolve(run_url, filesystem)
    with contextlib.suppress(FileNotFoundError):
        fs.rm(join(run, MARKER_DIR, token), recursive=True)
