"""Write a directory atomically: a staging name, then a commit in ONE step.

A directory (a checkpoint) that is interrupted mid-write (process killed, disk full, an
exception) is never listed and never loaded, and earlier directories are untouched:

- on a local filesystem, where renaming a directory is atomic, it is written under
  ``<parent>/.staging/<name>-<uuid>/`` and committed by renaming it to ``<parent>/<name>``;
- on an object store (``s3://``, ``gs://``, ``memory://``), where a "rename" is a copy, it is
  written in place under ``<parent>/<name>/`` next to a ``.writing`` marker, and committed by
  writing the ``.committed`` marker last (one PUT, which object stores apply atomically).

Either way a committed directory holds ``.committed``: a small JSON manifest of its files and
their sizes, so a file truncated or edited after the commit is reported, not half-loaded.

Example::

    with atomic_dir("s3://bucket/run", "checkpoint_000001") as staged:
        with staged.open("model.pt") as f:
            torch.save(state, f)
    list_committed("s3://bucket/run")   # -> ["checkpoint_000001"]
"""
from __future__ import annotations

import contextlib
import dataclasses
import datetime
import json
import logging
import os
import re
import shutil
import socket
import time
import uuid
from typing import IO, Any, Dict, Iterator, List, Optional

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from ..errors import CheckpointError, describe
from .storage import is_local, join, read_json, resolve, to_url, write_bytes_atomic

logger = logging.getLogger(__name__)

STAGING_DIR = ".staging"
WRITING_MARKER = ".writing"
COMMIT_MARKER = ".committed"
METADATA_FILE = ".metadata.json"
#: Files a committed manifest does not cover (markers; metadata may change after commit).
_UNTRACKED = (WRITING_MARKER, COMMIT_MARKER, METADATA_FILE)
_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,199}$")


@dataclasses.dataclass(frozen=True)
class StagedDir:
    """A directory being written; picklable, so workers can write their files into it.

    Attributes:
        fs: the filesystem.
        path: where to write now (the staging dir).
        final_path: where the directory appears once committed.
        name: the directory's final name.
    """

    fs: AbstractFileSystem
    path: str
    final_path: str
    name: str

    @property
    def url(self) -> str:
        return to_url(self.fs, self.path)

    @property
    def final_url(self) -> str:
        return to_url(self.fs, self.final_path)

    def open(self, relpath: str, mode: str = "wb") -> IO[Any]:
        """Open ``relpath`` inside the staging dir (parent dirs created)."""
        target = join(self.path, relpath)
        self.fs.makedirs(self.fs._parent(target), exist_ok=True)
        return self.fs.open(target, mode)

    def put_dir(self, local_dir: str) -> None:
        """Copy every file of the local directory ``local_dir`` into the staging dir."""
        local = LocalFileSystem()
        root = os.path.abspath(local_dir).rstrip("/")
        srcs = [p for p in local.find(root) if os.path.basename(p) not in (WRITING_MARKER, COMMIT_MARKER)]
        dsts = [join(self.path, p[len(root):]) for p in srcs]
        for d in {self.fs._parent(d) for d in dsts}:
            self.fs.makedirs(d, exist_ok=True)
        if srcs:
            self.fs.put(srcs, dsts)


def _check_name(name: Any) -> None:
    if not isinstance(name, str) or not _NAME.match(name):
        raise CheckpointError(f"checkpoint name {name!r} is not allowed: use letters, digits and "
                              "_ . = + -, not starting with '.' (at most 200 characters)")


def begin_dir(parent_url: Any, name: str, filesystem: Optional[Any] = None) -> StagedDir:
    """Start writing directory ``name`` under ``parent_url``; commit it with :func:`commit_dir`.

    Raises:
        CheckpointError: a bad name, or ``name`` exists already.
    """
    _check_name(name)
    fs, parent = resolve(parent_url, filesystem)
    final = join(parent, name)
    fs.invalidate_cache(parent)
    if fs.exists(final):
        if is_committed(fs, final):
            raise CheckpointError(f"checkpoint {to_url(fs, final)} already exists: pick another name "
                                  "or delete it first")
        if is_local(fs) or not fs.exists(join(final, WRITING_MARKER)):
            raise CheckpointError(f"{to_url(fs, final)} already exists and is not a committed "
                                  "checkpoint: pick another name or remove it")
        logger.warning("removing %s: an earlier write of it was interrupted", to_url(fs, final))
        fs.rm(final, recursive=True)
    path = join(parent, STAGING_DIR, f"{name}-{uuid.uuid4().hex[:8]}") if is_local(fs) else final
    fs.makedirs(path, exist_ok=True)
    info = {"name": name, "host": socket.gethostname(), "pid": os.getpid(), "started": time.time()}
    fs.pipe_file(join(path, WRITING_MARKER), json.dumps(info).encode())
    return StagedDir(fs=fs, path=path, final_path=final, name=name)


def commit_dir(staged: StagedDir) -> Dict[str, Any]:
    """Commit a staged directory in one step; returns its manifest.

    Raises:
        CheckpointError: the commit failed (the staged files stay; :func:`discard_dir` them).
    """
    fs = staged.fs
    fs.invalidate_cache(staged.path)
    files = {rel: size for rel, size in _list_files(fs, staged.path).items() if rel not in _UNTRACKED}
    manifest = {"name": staged.name, "committed_at": time.time(),
                "size_bytes": sum(files.values()), "files": files}
    data = json.dumps(manifest, indent=1).encode()
    try:
        if is_local(fs):
            write_bytes_atomic(fs, join(staged.path, COMMIT_MARKER), data)
            os.unlink(join(staged.path, WRITING_MARKER))
            os.rename(staged.path, staged.final_path)  # the commit
            _fsync_dir(os.path.dirname(staged.final_path))
        else:
            fs.pipe_file(join(staged.path, COMMIT_MARKER), data)  # the commit
            with contextlib.suppress(Exception):
                fs.rm_file(join(staged.path, WRITING_MARKER))
    except OSError as exc:
        raise CheckpointError(f"cannot commit checkpoint {staged.final_url}: {describe(exc)}") from exc
    fs.invalidate_cache(staged.final_path)
    logger.debug("committed %s (%d files, %d bytes)", staged.final_url, len(files), manifest["size_bytes"])
    return manifest


def _fsync_dir(path: str) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def discard_dir(staged: StagedDir) -> None:
    """Remove an uncommitted staging dir; a committed directory is never touched."""
    fs = staged.fs
    fs.invalidate_cache(staged.path)
    if not is_local(fs) and fs.exists(join(staged.path, COMMIT_MARKER)):
        return
    try:
        fs.rm(staged.path, recursive=True)
    except FileNotFoundError:
        pass
    except Exception as exc:  # the original error matters more; clean_staging gets it later
        logger.warning("could not remove the staging dir %s: %s", staged.url, describe(exc))


@contextlib.contextmanager
def atomic_dir(parent_url: Any, name: str, filesystem: Optional[Any] = None) -> Iterator[StagedDir]:
    """Write directory ``name`` under ``parent_url``: committed on success, discarded on error.

    Example::

        with atomic_dir("/runs/r1", "snapshot_000001") as staged:
            torch.save(state, os.path.join(staged.path, "state.pt"))
    """
    staged = begin_dir(parent_url, name, filesystem)
    try:
        yield staged
        commit_dir(staged)
    except BaseException:
        discard_dir(staged)
        raise


def _list_files(fs: AbstractFileSystem, root: str) -> Dict[str, int]:
    root = root.rstrip("/")
    found = fs.find(root, detail=True)
    return {name[len(root):].lstrip("/"): int(info.get("size") or 0) for name, info in found.items()
            if info.get("type", "file") != "directory"}


def is_committed(fs: AbstractFileSystem, path: str) -> bool:
    """Whether the directory ``path`` is a committed checkpoint."""
    fs.invalidate_cache(path)
    return fs.exists(join(path, COMMIT_MARKER))


def read_manifest(fs: AbstractFileSystem, path: str) -> Optional[Dict[str, Any]]:
    """The commit manifest of ``path``, or None when it is not a committed directory.

    Raises:
        CheckpointError: the manifest is damaged.
    """
    marker = join(path, COMMIT_MARKER)
    data = read_json(fs, marker, "checkpoint marker", error=CheckpointError, missing_ok=True,
                     fix="the checkpoint cannot be trusted: load another one")
    if data is None:
        return None
    files = data.get("files") if isinstance(data, dict) else None
    if not isinstance(files, dict) or not all(isinstance(v, int) for v in files.values()):
        raise CheckpointError(f"checkpoint marker {to_url(fs, marker)} is damaged (no file list): "
                              "the checkpoint cannot be trusted: load another one")
    return data


def verify_dir(fs: AbstractFileSystem, path: str) -> Dict[str, int]:
    """Check a directory before loading it; returns ``{relative path: size}`` of its files.

    A committed directory must still hold every file of its manifest, at the committed size.

    Raises:
        CheckpointError: the directory is missing, was interrupted mid-write, or a file is
            missing or has changed size (naming the file).
    """
    url = to_url(fs, path)
    fs.invalidate_cache(path)
    if not fs.isdir(path):
        raise CheckpointError(f"checkpoint directory {url} does not exist")
    files = _list_files(fs, path)
    manifest = read_manifest(fs, path)
    if manifest is None:
        if WRITING_MARKER in files:
            raise CheckpointError(f"checkpoint {url} was interrupted mid-write (it has no "
                                  f"{COMMIT_MARKER} marker): load an earlier checkpoint")
        return files
    for rel, size in manifest["files"].items():
        got = files.get(rel)
        if got is None:
            raise CheckpointError(f"checkpoint file {join(url, rel)} is missing: it was deleted after "
                                  "the checkpoint was committed; load another checkpoint")
        if got != size:
            raise CheckpointError(f"checkpoint file {join(url, rel)} has {got} bytes but had {size} "
                                  "when committed (truncated or edited?): load another checkpoint")
    return files


def list_committed(parent_url: Any, filesystem: Optional[Any] = None) -> List[str]:
    """Names of the committed directories under ``parent_url``, sorted; [] if it is missing."""
    fs, parent = resolve(parent_url, filesystem)
    fs.invalidate_cache(parent)
    try:
        entries = fs.ls(parent, detail=True)
    except FileNotFoundError:
        return []
    names = sorted(e["name"].rstrip("/").rsplit("/", 1)[-1] for e in entries if e.get("type") == "directory")
    return [n for n in names if not n.startswith(".") and is_committed(fs, join(parent, n))]


def delete_dir(fs: AbstractFileSystem, path: str) -> None:
    """Delete a committed directory so that a half-finished delete is never listed or loaded."""
    fs.invalidate_cache(path)
    if is_local(fs):
        parent, name = os.path.split(path)
        tomb = join(parent, STAGING_DIR, f"deleting-{name}-{uuid.uuid4().hex[:8]}")
        os.makedirs(os.path.dirname(tomb), exist_ok=True)
        os.rename(path, tomb)  # one step: gone from listings
        shutil.rmtree(tomb, ignore_errors=True)
        return
    fs.pipe_file(join(path, WRITING_MARKER), b"{}")  # what is left is a partial, cleanable
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(join(path, COMMIT_MARKER))  # one step: uncommitted
    fs.rm(path, recursive=True)


def _newest(fs: AbstractFileSystem, path: str) -> float:
    newest = 0.0
    for info in fs.find(path, detail=True).values():
        stamp = info.get("mtime") or info.get("LastModified") or info.get("created") or 0.0
        if isinstance(stamp, datetime.datetime):
            stamp = stamp.timestamp()
        newest = max(newest, float(stamp))
    return newest


def clean_staging(parent_url: Any, filesystem: Optional[Any] = None, *,
                  older_than_s: float = 0.0) -> List[str]:
    """Remove directories under ``parent_url`` left by interrupted writes.

    Args:
        parent_url: the run directory.
        filesystem: optional fsspec filesystem.
        older_than_s: only remove leftovers whose newest file is at least this old; pass a
            positive age when another process may be writing into the same run now.

    Returns:
        The URLs removed.
    """
    fs, parent = resolve(parent_url, filesystem)
    now = time.time()
    fs.invalidate_cache(parent)
    if is_local(fs):
        staging = join(parent, STAGING_DIR)
        candidates = fs.ls(staging, detail=False) if fs.isdir(staging) else []
    else:
        try:
            entries = fs.ls(parent, detail=True)
        except FileNotFoundError:
            entries = []
        candidates = [e["name"].rstrip("/") for e in entries if e.get("type") == "directory"
                      and not e["name"].rstrip("/").rsplit("/", 1)[-1].startswith(".")]
        candidates = [c for c in candidates if not fs.exists(join(c, COMMIT_MARKER))
                      and fs.exists(join(c, WRITING_MARKER))]
    removed = []
    for path in candidates:
        if older_than_s > 0 and now - _newest(fs, path) < older_than_s:
            continue
        fs.rm(path, recursive=True)
        removed.append(to_url(fs, path))
        logger.info("removed %s, left by an interrupted write", to_url(fs, path))
    return removed
