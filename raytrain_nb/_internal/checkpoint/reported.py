"""Reported checkpoints in storage: every rank uploads into one staged directory, marking its
upload started and done, so a crash never commits half of one.

``report(metrics, checkpoint=...)`` on a worker calls :func:`upload`. The driver commits a
checkpoint only once every rank of the world reported it (with files or without); it first
writes a ``complete`` marker (:func:`mark_complete`), so that after a crash between that and the
commit, :func:`complete_info` still says every rank reported. A set without that evidence is
discarded, never committed (a rank that died before reporting would be missing from it).

Markers live in ``<run>/.staging/.markers/``: ``<name>.rank-<r>.started``, ``<name>.rank-<r>.done``
(JSON: the rank's metrics and the world size) and ``<name>.complete`` (JSON: world size, metrics).

A rank whose record of a report dies with it (killed before the driver's next poll, ~0.1 s) would
leave no evidence that it reported; so on a local disk each rank also appends the index of every
report to its ledger ``reports.rank-<r>`` there (:class:`ReportLedger`: one small append, which
survives the process: it is in the page cache once write(2) returns, before ``report()`` does). On an
object store there is no ledger: such a set is discarded and training resumes from the checkpoint before it.
"""
from __future__ import annotations

import ctypes
import errno
import json
import os
import re
from typing import Any, Callable, Dict, List, Optional

from .staging import COMMIT_MARKER, STAGING_DIR, WRITING_MARKER, StagedDir
from .storage import is_local, join, resolve, to_url

MARKERS = ".markers"
#: The name of the reported checkpoint of report index N.
REPORT_NAME = re.compile(r"^checkpoint_(\d+)$")


def report_name(index: int) -> str:
    """``checkpoint_000012`` for report index 12."""
    return f"checkpoint_{index:06d}"


def report_index(name: str) -> Optional[int]:
    """The report index of a reported checkpoint's name (None for another name)."""
    match = REPORT_NAME.match(name)
    return int(match.group(1)) if match else None


def report_staging(run_url: str, name: str, dir_name: Optional[str] = None, in_place: bool = False) -> StagedDir:
    """The staged directory every rank writes report ``name`` into (the same on all ranks).

    Its markers are named by ``name`` (``checkpoint_NNNNNN``, the report index); it is committed as
    ``<run>/<dir_name>`` (``report(checkpoint_dir_name=...)``; default ``name``). ``in_place``: the files are
    already there (``NO_UPLOAD``, an upload function): nothing is staged, the commit only marks it.
    """
    fs, run = resolve(run_url)
    final = join(run, dir_name or name)
    path = final if in_place or not is_local(fs) else join(run, STAGING_DIR, name)
    return StagedDir(fs=fs, path=path, final_path=final, name=name)


def staging_of(run_url: str, name: str) -> StagedDir:
    """The staged directory of report ``name`` as its ranks' markers describe it (directory name, in place)."""
    fs, run = resolve(run_url)
    staged = report_staging(run_url, name)
    for rank in upload_state(staged):
        info = _read_json(fs, marker(staged, rank, "started")) or {}
        if isinstance(info.get("dir"), str) and info["dir"]:
            return report_staging(run_url, name, info["dir"], bool(info.get("in_place")))
    return staged


def marker(staged: StagedDir, rank: int, state: str) -> str:
    base = staged.final_path.rsplit("/", 1)[0]
    return join(base, STAGING_DIR, MARKERS, f"{staged.name}.rank-{rank}.{state}")


def upload(staged: StagedDir, rank: int, local_dir: Optional[str], metrics: Optional[Dict[str, Any]] = None,
           world_size: int = 0) -> None:
    """Copy this rank's checkpoint files into the staged directory, marking start and end (``local_dir`` None:
    the files are in place already, only marked)."""
    fs = staged.fs
    fs.makedirs(staged.path, exist_ok=True)
    start = marker(staged, rank, "started")
    fs.makedirs(start.rsplit("/", 1)[0], exist_ok=True)
    in_place = staged.path == staged.final_path and is_local(fs)
    fs.pipe_file(start, json.dumps({"dir": staged.final_path.rsplit("/", 1)[-1], "in_place": in_place}).encode())
    if not fs.exists(join(staged.path, WRITING_MARKER)):  # what commit_dir expects of a staged dir
        fs.pipe_file(join(staged.path, WRITING_MARKER), b"{}")
    if local_dir is not None:
        staged.put_dir(local_dir)
    done = {"metrics": metrics or {}, "world_size": int(world_size)}
    fs.pipe_file(marker(staged, rank, "done"), json.dumps(done, default=str).encode())


def _read_json(fs: Any, path: str) -> Optional[Dict[str, Any]]:
    try:
        data = json.loads(fs.cat_file(path).decode() or "{}")
    except (FileNotFoundError, ValueError, UnicodeDecodeError):
        return None
    return data if isinstance(data, dict) else None


def done_info(staged: StagedDir, rank: int) -> Dict[str, Any]:
    """What rank ``rank`` recorded with its finished upload: ``{"metrics": ..., "world_size": ...}``."""
    data = _read_json(staged.fs, marker(staged, rank, "done")) or {}
    if "metrics" not in data:  # an older marker held only the metrics
        data = {"metrics": data, "world_size": 0}
    return data


def _complete_marker(staged: StagedDir) -> str:
    return join(staged.final_path.rsplit("/", 1)[0], STAGING_DIR, MARKERS, f"{staged.name}.complete")


def mark_complete(staged: StagedDir, world_size: int, metrics: Dict[str, Any]) -> None:
    """The driver's record that every rank of a ``world_size`` world reported ``staged``."""
    path = _complete_marker(staged)
    staged.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
    staged.fs.pipe_file(path, json.dumps({"world_size": world_size, "metrics": metrics}, default=str).encode())


def complete_info(staged: StagedDir) -> Optional[Dict[str, Any]]:
    """``{"world_size", "metrics"}`` when the driver recorded every rank's report of ``staged``, else None."""
    return _read_json(staged.fs, _complete_marker(staged))


def pending_names(run_url: str) -> List[str]:
    """Names of reported checkpoints with upload markers or a local staged directory (not committed yet)."""
    fs, run = resolve(run_url)
    names = set()
    for folder in (join(run, STAGING_DIR, MARKERS), join(run, STAGING_DIR)):
        fs.invalidate_cache(folder)
        try:
            entries = [p.rstrip("/").rsplit("/", 1)[-1] for p in fs.ls(folder, detail=False)]
        except (FileNotFoundError, NotADirectoryError):
            continue
        names.update(e.split(".", 1)[0] for e in entries if REPORT_NAME.match(e.split(".", 1)[0]))
    return sorted(names)


def uploads_in_progress(run_url: str) -> List[str]:
    """The directory names of reported checkpoints being uploaded now (not committed, markers present)."""
    return [staging_of(run_url, name).final_path.rsplit("/", 1)[-1] for name in pending_names(run_url)]


def discard(staged: StagedDir) -> None:
    """Remove an uncommitted reported checkpoint: its staged files and its markers."""
    fs = staged.fs
    path = staged.path
    if path == staged.final_path and fs.exists(join(path, COMMIT_MARKER)):
        raise ValueError(f"{to_url(fs, path)} is committed: not discarding it")  # never reached by recover()
    if path == staged.final_path and is_local(fs):  # in place (NO_UPLOAD): the user's files stay, never listed
        if fs.exists(join(path, WRITING_MARKER)):
            fs.rm_file(join(path, WRITING_MARKER))
    elif fs.exists(path):
        fs.rm(path, recursive=True)
    clear_markers(staged)


def upload_state(staged: StagedDir) -> Dict[int, str]:
    """``{rank: "started"|"done"}`` for every rank that began uploading into ``staged``."""
    fs = staged.fs
    base = marker(staged, 0, "x").rsplit("/", 1)[0]
    out: Dict[int, str] = {}
    fs.invalidate_cache(base)
    try:
        names = [p.rsplit("/", 1)[-1] for p in fs.ls(base, detail=False)]
    except FileNotFoundError:
        return out
    prefix = f"{staged.name}.rank-"
    for name in names:
        if name.startswith(prefix):
            rank_s, _, state = name[len(prefix):].partition(".")
            if rank_s.isdigit() and (state == "done" or out.get(int(rank_s)) != "done"):
                out[int(rank_s)] = state
    return out


def clear_markers(staged: StagedDir) -> None:
    """Remove every marker of ``staged`` (after its commit, or when it is discarded)."""
    paths = [marker(staged, rank, state) for rank in upload_state(staged) for state in ("started", "done")]
    for path in paths + [_complete_marker(staged)]:
        try:
            staged.fs.rm_file(path)
        except FileNotFoundError:
            pass


def _ledger_path(run: str, rank: int) -> str:
    return join(run, STAGING_DIR, MARKERS, f"reports.rank-{rank}")


def _gil_holding_write() -> Optional[Callable[[int, bytes, Any], int]]:
    """libc's ``write(fd, buf, n)`` called with the GIL held (ctypes.PyDLL), or None where there is none.

    ``os.write`` releases the GIL around the system call; in a process where another thread waits for
    the GIL (a Ray worker's threads answering the driver) the caller may then wait for that thread's
    switch interval (5 ms) to get it back, where the call itself takes 1-2 us. An append of a line to
    a local file's page cache does not block, so holding the GIL is cheap.
    """
    try:
        write = ctypes.PyDLL(None).write
    except (OSError, AttributeError, TypeError):  # no C library to load by this name (Windows)
        return None
    write.restype = ctypes.c_ssize_t  # arguments: a Python int (C int), bytes (char *) and a c_size_t
    return write


_WRITE = _gil_holding_write()
#: ``n`` as write(2) takes it, made once for the lengths of a ledger's lines (no argtypes: 0.4 us less a call).
_SIZES = tuple(ctypes.c_size_t(n) for n in range(32))


def append_keeps_gil() -> bool:
    """Whether :func:`append` keeps the GIL here (else it uses ``os.write``)."""
    return _WRITE is not None


def append(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (opened ``O_APPEND``) before returning, keeping the GIL when it can.

    A short or failed write (rare: a full disk, a closed fd, a signal) goes on through ``os.write``,
    which retries on a signal and raises the error with its errno.

    Raises:
        OSError: the write failed, as ``os.write`` raises it.
    """
    written = _WRITE(fd, data, _SIZES[len(data)]) if _WRITE is not None and len(data) < len(_SIZES) else -1
    while written != len(data):
        data = data[max(written, 0):]
        written = os.write(fd, data)
        if written == 0:  # nothing taken of a non-empty buffer: no disk that will take the rest
            raise OSError(errno.EIO, f"write to fd {fd} took nothing")


class ReportLedger:
    """A rank's append-only record of the report indexes it reached (local disks only).

    :meth:`add` is on every ``report()`` call: one write(2) of a line to an ``O_APPEND`` fd, which is
    in the page cache (and outlives a SIGKILL of this process) when ``add`` returns.
    """

    def __init__(self, run_url: str, rank: int) -> None:
        fs, run = resolve(run_url)
        self.rank = rank
        self.path = _ledger_path(run, rank) if is_local(fs) else None
        self._fd: Optional[int] = None

    def add(self, index: int) -> None:
        """Record that this rank called ``report()`` with report index ``index``."""
        if self.path is None:
            return
        if self._fd is None:
            os.makedirs(os.path.dirname(self.path), exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        append(self._fd, b"%d\n" % index)

    def close(self) -> None:
        """Close the ledger file (it stays on disk)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def ledger_ranks(run_url: str, index: int, world_size: int) -> List[int]:
    """The ranks (of ``world_size``) whose ledger says they reported ``index``."""
    fs, run = resolve(run_url)
    if not is_local(fs):
        return []
    found = []
    for rank in range(world_size):
        try:
            with open(_ledger_path(run, rank), "rb") as fh:
                seen = {line.strip() for line in fh}
        except OSError:
            continue
        if str(index).encode() in seen:
            found.append(rank)
    return found


def clear_ledgers(run_url: str) -> None:
    """Empty every rank's ledger (once no reported checkpoint waits for evidence)."""
    fs, run = resolve(run_url)
    if not is_local(fs):
        return
    folder = join(run, STAGING_DIR, MARKERS)
    for name in os.listdir(folder) if os.path.isdir(folder) else []:
        if name.startswith("reports.rank-"):
            os.truncate(os.path.join(folder, name), 0)  # ranks append with O_APPEND: they go on at 0
