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
import json
import logging
import os
import shutil
import socket
import time
import uuid
from typing import IO, Any, Dict, Iterator, List, Optional, Tuple

from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem

from ..errors import CheckpointError, describe
from ..processes import pid_alive
from .storage import (fsync_dir, is_dir_name, is_local, join, newest_mtime, read_json, resolve, to_url, unsafe_relpath,
                      write_bytes_atomic)

logger = logging.getLogger(__name__)

STAGING_DIR = ".staging"
WRITING_MARKER = ".writing"
COMMIT_MARKER = ".committed"
METADATA_FILE = ".metadata.json"
#: Files a committed manifest does not cover (markers; metadata may change after commit).
_UNTRACKED = (WRITING_MARKER, COMMIT_MARKER, METADATA_FILE)
#: How old (newest file, seconds) an interrupted write of another host must be before it is removed.
LEFTOVER_AGE_S = 3600.0
_TOMBSTONE = "deleting-"


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
    if not is_dir_name(name):
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
            fsync_dir(os.path.dirname(staged.final_path))
        else:
            fs.pipe_file(join(staged.path, COMMIT_MARKER), data)  # the commit
            with contextlib.suppress(Exception):
                fs.rm_file(join(staged.path, WRITING_MARKER))
    except OSError as exc:
        raise CheckpointError(f"cannot commit checkpoint {staged.final_url}: {describe(exc)}") from exc
    fs.invalidate_cache(staged.final_path)
    logger.debug("committed %s (%d files, %d bytes)", staged.final_url, len(files), manifest["size_bytes"])
    return manifest


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
    """Check a directory before loading it; returns ``{relative path: size}`` of the files to load.

    A committed directory must still hold every file of its manifest, at the committed size;
    only those files (and ``.metadata.json``) are returned: anything else beside them was not
    committed and is never loaded. A plain directory (no manifest, no ``.writing``) returns
    every file. Names are checked either way: storage may be shared with others.

    Raises:
        CheckpointError: the directory is missing or was interrupted mid-write, a file is
            missing or has changed size, or a name is absolute or has ``..`` (naming the file).
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
        _check_names(url, files)
        return files
    _check_names(url, manifest["files"])
    for rel, size in manifest["files"].items():
        got = files.get(rel)
        if got is None:
            raise CheckpointError(f"checkpoint file {join(url, rel)} is missing: it was deleted after "
                                  "the checkpoint was committed; load another checkpoint")
        if got != size:
            raise CheckpointError(f"checkpoint file {join(url, rel)} has {got} bytes but had {size} "
                                  "when committed (truncated or edited?): load another checkpoint")
    extra = sorted(set(files) - set(manifest["files"]) - set(_UNTRACKED))
    if extra:
        logger.debug("checkpoint %s holds files its manifest does not list (never loaded): %s", url,
                     ", ".join(repr(e) for e in extra[:10]))
    kept = dict(manifest["files"])
    if METADATA_FILE in files:
        kept[METADATA_FILE] = files[METADATA_FILE]
    return kept


def _check_names(url: str, rels: Any) -> None:
    """Refuse a checkpoint listing a file name that is absolute or has ``..`` (storage is shared)."""
    for rel in rels:
        if unsafe_relpath(rel):
            raise CheckpointError(f"checkpoint {url} lists the file {rel!r}, which is absolute or leaves the "
                                  "checkpoint ('..'): the checkpoint cannot be trusted; load another one")


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
        tomb = join(parent, STAGING_DIR, f"{_TOMBSTONE}{name}-{uuid.uuid4().hex[:8]}")
        os.makedirs(os.path.dirname(tomb), exist_ok=True)
        os.rename(path, tomb)  # one step: gone from listings
        shutil.rmtree(tomb, ignore_errors=True)
        return
    fs.pipe_file(join(path, WRITING_MARKER), b"{}")  # what is left is a partial, cleanable
    with contextlib.suppress(FileNotFoundError):
        fs.rm_file(join(path, COMMIT_MARKER))  # one step: uncommitted
    fs.rm(path, recursive=True)


def clean_staging(parent_url: Any, filesystem: Optional[Any] = None, *,
                  older_than_s: float = 0.0) -> List[str]:
    """Remove directories under ``parent_url`` left by interrupted writes, whoever wrote them.

    Args:
        parent_url: the run directory.
        filesystem: optional fsspec filesystem.
        older_than_s: only remove leftovers whose newest file is at least this old; pass a
            positive age when another process may be writing into the same run now.

    Returns:
        The URLs removed.
    """
    fs, parent = resolve(parent_url, filesystem)
    fs.invalidate_cache(parent)
    now = time.time()
    return _remove(fs, [(p, "left by an interrupted write") for p in _staged_dirs(fs, parent)
                        if older_than_s <= 0 or now - newest_mtime(fs, p) >= older_than_s])


def clean_leftovers(run_url: Any, filesystem: Optional[Any] = None) -> List[str]:
    """Remove what interrupted writes and deletes left in a run directory; never anything else.

    Removed: local ``.staging/deleting-*`` tombstones; staged writes whose ``.writing`` marker
    names this host and a process that is gone; other staged writes (another host, or a marker
    that cannot be read) once their newest file is :data:`LEFTOVER_AGE_S` old. On an object
    store a staged write is ``<run>/<name>/`` with ``.writing`` and no ``.committed``.

    Returns:
        The URLs removed (each is logged).
    """
    fs, run = resolve(run_url, filesystem)
    fs.invalidate_cache(run)
    found = []
    for path in _staged_dirs(fs, run):
        tomb = is_local(fs) and path.rsplit("/", 1)[-1].startswith(_TOMBSTONE)
        why = "a delete that was interrupted" if tomb and not fs.exists(join(path, WRITING_MARKER)) \
            else _abandoned(fs, path)
        if why:
            found.append((path, why))
    return _remove(fs, found)


def _staged_dirs(fs: AbstractFileSystem, run: str) -> List[str]:
    """Directories of unfinished writes: in ``.staging/`` locally, else beside committed ones."""
    parent = join(run, STAGING_DIR) if is_local(fs) else run
    try:
        dirs = [e["name"].rstrip("/") for e in fs.ls(parent, detail=True) if e.get("type") == "directory"]
    except (FileNotFoundError, NotADirectoryError):
        return []
    dirs = [d for d in dirs if not d.rsplit("/", 1)[-1].startswith(".")]
    if is_local(fs):
        return [d for d in dirs if not os.path.islink(d)]
    return [d for d in dirs if fs.exists(join(d, WRITING_MARKER)) and not fs.exists(join(d, COMMIT_MARKER))]


def _abandoned(fs: AbstractFileSystem, path: str) -> Optional[str]:
    """Why the staged write at ``path`` is abandoned, or None while its writer may still be at it."""
    try:
        info = json.loads(fs.cat_file(join(path, WRITING_MARKER)).decode("utf-8"))
    except (OSError, ValueError, UnicodeDecodeError):
        info = None
    pid = info.get("pid") if isinstance(info, dict) else None
    if isinstance(info, dict) and info.get("host") == socket.gethostname() and type(pid) is int and pid > 0:
        return None if pid_alive(pid) else f"an interrupted write: its writer (pid {pid} on this host) is gone"
    if time.time() - newest_mtime(fs, path) >= LEFTOVER_AGE_S:
        return f"an interrupted write of another host (or unreadable marker), untouched for {LEFTOVER_AGE_S:.0f}s"
    return None


def _remove(fs: AbstractFileSystem, found: List[Tuple[str, str]]) -> List[str]:
    """Remove each ``(path, why)``; returns the URLs removed (a failure is logged, not raised)."""
    removed = []
    for path, why in found:
        url = to_url(fs, path)
        try:
            fs.rm(path, recursive=True)
        except FileNotFoundError:
            continue
        except Exception as exc:  # one stuck leftover does not stop the others
            logger.warning("could not remove %s (%s): %s; remove it by hand", url, why, describe(exc))
            continue
        removed.append(url)
        logger.info("removed %s: %s", url, why)
    return removed
