"""Every storage path goes through fsspec: resolve it, check it, read and write small files.

Local paths (``~`` expanded) and any fsspec URL (``s3://``, ``gs://``, ``memory://``,
``file://``) resolve to ``(filesystem, path)``; a missing implementation package is named in
the error. Directories are written atomically by :mod:`.staging`; the check that every worker
sees the group's storage lives in :mod:`.storage_check`.

Example::

    fs, path = resolve("s3://bucket/runs/r1")
    check_writable("~/raytrain_nb_results")
"""
from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import uuid
from typing import Any, Optional, Tuple, Type

import fsspec
from fsspec import AbstractFileSystem
from fsspec.implementations.local import LocalFileSystem
from fsspec.registry import known_implementations

from .. import settings
from ..errors import CheckpointError, StorageError, describe

STORAGE_PATH_ENV = settings.STORAGE_PATH.name
DEFAULT_STORAGE_PATH = settings.DEFAULT_STORAGE_PATH
#: Protocols whose files live inside one process: fine for a Checkpoint, not for a group.
PER_PROCESS_PROTOCOLS = ("memory",)
#: The characters of a run's name (a directory name in shared storage).
_RUN_NAME = re.compile(r"^[A-Za-z0-9_.=+-]{1,200}$")
#: A checkpoint directory's name inside a run.
_DIR_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.=+-]{0,199}$")

# ---------------------------------------------------------------- resolving paths


def resolve(url_or_path: Any, filesystem: Optional[Any] = None,
            **storage_options: Any) -> Tuple[AbstractFileSystem, str]:
    """Turn a local path or an fsspec URL into ``(filesystem, path)``.

    Args:
        url_or_path: ``~/results``, ``/abs/dir``, ``file:///dir``, ``s3://bucket/dir``,
            ``gs://...``, ``memory://dir`` or any other fsspec URL.
        filesystem: an fsspec filesystem (or a ``pyarrow.fs.FileSystem``) to use instead of
            the one the URL names; the URL's protocol, if any, is stripped.
        **storage_options: passed to the filesystem (e.g. ``endpoint_url`` for s3).

    Returns:
        The filesystem and the path on it (absolute for local paths, ``~`` expanded).

    Raises:
        StorageError: an empty path, an unknown protocol, or a protocol whose package is
            not installed (naming the package to install).

    Example::

        fs, path = resolve("~/raytrain_nb_results/run1")
    """
    try:
        text = os.fspath(url_or_path)
    except TypeError:
        text = None
    if not isinstance(text, str) or not text.strip():
        raise StorageError(f"storage path {url_or_path!r} is not a path: pass a local path or "
                           "a URL such as s3://bucket/dir")
    if filesystem is not None:
        fs = as_fsspec(filesystem)
        path = fs._strip_protocol(text)
        if isinstance(fs, LocalFileSystem):
            path = os.path.abspath(os.path.expanduser(path))
        return fs, path
    if "://" not in text and "::" not in text:
        return LocalFileSystem(), os.path.abspath(os.path.expanduser(text))
    protocol = text.split("::")[-1].split("://", 1)[0] if "://" in text else text.split("::")[0]
    try:
        fs, path = fsspec.core.url_to_fs(text, **storage_options)
    except ImportError as exc:
        raise StorageError(_missing_package(protocol, exc)) from exc
    except Exception as exc:
        if isinstance(exc, ValueError) and "protocol not known" in str(exc).lower():
            raise StorageError(f"{text!r} uses the unknown protocol {protocol}://: use a local path "
                               "or s3://, gs://, abfs://, memory:// (or install the fsspec "
                               f"package that provides {protocol}://)") from exc
        raise StorageError(f"storage URL {text!r} cannot be opened ({describe(exc)}): check the URL "
                           "and its storage options") from exc
    if isinstance(fs, LocalFileSystem):
        path = os.path.abspath(os.path.expanduser(path))
    return fs, path


def _missing_package(protocol: str, exc: ImportError) -> str:
    impl = known_implementations.get(protocol, {}).get("class", "")
    top = impl.split(".")[0]
    cause = exc.__cause__ if isinstance(exc.__cause__, ImportError) else exc
    missing = (getattr(cause, "name", None) or "").split(".")[0]
    if top and top != "fsspec" and (not missing or missing == top):
        return f"{protocol}:// needs the {top} package: pip install {top}"
    if missing:
        needed_by = f" (needed by {top})" if top and top != "fsspec" else ""
        return f"{protocol}:// needs the {missing} package{needed_by}: pip install {missing}"
    return f"{protocol}:// cannot be used: {exc}"


def as_fsspec(filesystem: Any) -> AbstractFileSystem:
    if isinstance(filesystem, AbstractFileSystem):
        return filesystem
    if type(filesystem).__module__.startswith("pyarrow"):
        from fsspec.implementations.arrow import ArrowFSWrapper  # fsspec: optional or heavy, loaded on first use

        return ArrowFSWrapper(filesystem)
    raise StorageError(f"filesystem={filesystem!r} is not a filesystem: pass an fsspec filesystem "
                       "(e.g. s3fs.S3FileSystem(...)) or a pyarrow.fs.FileSystem")


def is_local(fs: AbstractFileSystem) -> bool:
    """Whether ``fs`` is the local disk (where a directory rename is atomic)."""
    return isinstance(fs, LocalFileSystem)


def to_url(fs: AbstractFileSystem, path: str) -> str:
    """The URL of ``path`` on ``fs``: a plain path for local files, ``proto://...`` otherwise."""
    return path if is_local(fs) else fs.unstrip_protocol(path)


def join(path: str, *parts: str) -> str:
    """Join path components with ``/`` (fsspec paths use ``/`` on every filesystem)."""
    return "/".join([path.rstrip("/"), *(p.strip("/") for p in parts)])


def unsafe_relpath(rel: Any) -> bool:
    """Whether the relative path ``rel`` (from storage) is empty, absolute or has a ``..`` component."""
    if not isinstance(rel, str) or not rel or "\0" in rel or rel.startswith(("/", "\\")) or os.path.isabs(rel):
        return True
    return any(part == ".." for part in re.split(r"[/\\]", rel))


def is_dir_name(name: Any) -> bool:
    """Whether ``name`` may name a checkpoint directory: one plain, visible path component."""
    return isinstance(name, str) and bool(_DIR_NAME.match(name)) and not unsafe_relpath(name)


def check_run_name(name: Any) -> None:
    """Refuse a run name that is not one plain directory name.

    Raises:
        CheckpointError: the name is not a string, empty, longer than 200 characters, starts
            with ``.``, has a ``/``, ``\\`` or ``..`` or any character but letters, digits and
            ``_ . = + -``.

    Example::

        check_run_name("my-run")    # fine
        check_run_name("../x")      # CheckpointError
    """
    example = "e.g. --name my-run"
    if not isinstance(name, str):
        raise CheckpointError(f"run name {name!r} is not a string: pass a name such as --name my-run")
    if not name:
        raise CheckpointError("run name '' is empty: pass a name such as --name my-run")
    if len(name) > 200:
        raise CheckpointError(f"run name {name[:20]!r}... is {len(name)} characters long: use at most 200, {example}")
    if not _RUN_NAME.match(name) or name.startswith(".") or unsafe_relpath(name):
        raise CheckpointError(f"run name {name!r} is not allowed: use letters, digits and _ . = + - (no '/' or "
                              f"'..', not starting with '.'), {example}")


def newest_mtime(fs: AbstractFileSystem, path: str) -> float:
    """When the newest file under ``path`` was last modified (seconds since the epoch).

    An empty directory counts by its own time where the filesystem keeps one (else 0).
    """
    infos = list(fs.find(path, detail=True).values())
    if not infos:
        with contextlib.suppress(OSError):
            infos = [fs.info(path)]
    newest = 0.0
    for info in infos:
        stamp = info.get("mtime") or info.get("LastModified") or info.get("created") or 0.0
        if isinstance(stamp, datetime.datetime):
            stamp = stamp.timestamp()
        newest = max(newest, float(stamp))
    return newest


def default_storage_path() -> str:
    """``$RAYTRAIN_NB_STORAGE_PATH`` if set, else ``~/raytrain_nb_results`` (expanded)."""
    value = settings.storage_path()
    if value:
        return value if "://" in value else os.path.abspath(os.path.expanduser(value))
    return os.path.expanduser(DEFAULT_STORAGE_PATH)


def check_writable(url: Any, filesystem: Optional[Any] = None) -> Tuple[AbstractFileSystem, str]:
    """Create ``url`` if needed and prove it writable with a probe file.

    Returns:
        ``(filesystem, path)`` as :func:`resolve` gives them.

    Raises:
        StorageError: naming the path, the cause and the knob to change.
    """
    fs, path = resolve(url, filesystem)
    probe = join(path, f".write_test-{uuid.uuid4().hex[:8]}")
    try:
        fs.makedirs(path, exist_ok=True)
        fs.pipe_file(probe, b"ok")
        if fs.cat_file(probe) != b"ok":
            raise OSError("the probe file read back different bytes")
        fs.rm_file(probe)
    except Exception as exc:
        raise StorageError(f"storage path {to_url(fs, path)} is not writable ({describe(exc)}): pass a "
                           f"writable --storage URL or set {STORAGE_PATH_ENV}") from exc
    return fs, path


def refuse_per_process(url: Any, filesystem: Optional[Any] = None) -> Tuple[AbstractFileSystem, str]:
    """Refuse a filesystem that lives inside one process as a worker group's storage.

    ``memory://`` serves a :class:`Checkpoint` within one process, but every worker is its own
    process and would see an empty filesystem.

    Raises:
        StorageError: for ``memory://`` (and any other per-process protocol).
    """
    fs, path = resolve(url, filesystem)
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    for proto in protocols:
        if proto in PER_PROCESS_PROTOCOLS:
            raise StorageError(f"{to_url(fs, path)} cannot be a worker group's storage: {proto}:// "
                               "lives inside one process, so workers would not see the driver's files "
                               "or each other's; use a local path on one machine, or s3://, gs:// or "
                               "a shared filesystem on a cluster")
    return fs, path


# ---------------------------------------------------------------- small files


def write_bytes_atomic(fs: AbstractFileSystem, path: str, data: bytes) -> None:
    """Replace the file ``path`` with ``data`` in one step (readers see old or new, never half)."""
    if is_local(fs):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.tmp-{uuid.uuid4().hex[:8]}"
        try:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
    else:
        fs.pipe_file(path, data)  # one PUT: object stores replace an object atomically


def fsync_dir(path: str) -> None:
    """Flush a local directory's entries (a rename in it) to disk; best effort."""
    with contextlib.suppress(OSError):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def to_json(value: Any, what: str, error: Type[Exception] = StorageError, indent: Optional[int] = None) -> str:
    """``json.dumps`` that turns numpy/torch scalars into numbers and names a bad key.

    Raises:
        error: naming ``what[key]`` and the type that cannot be stored.
    """
    def default(obj: Any) -> Any:
        item = getattr(obj, "item", None)
        if callable(item):
            with contextlib.suppress(Exception):
                return item()
        raise TypeError(f"a {type(obj).__name__} is not JSON-serializable")

    try:
        return json.dumps(value, default=default, indent=indent)
    except (TypeError, ValueError) as exc:
        where = what
        if isinstance(value, dict):
            for key, item in value.items():
                try:
                    json.dumps({key: item}, default=default)
                except (TypeError, ValueError):
                    where = f"{what}[{key!r}]"
                    break
        raise error(f"{where} cannot be stored as JSON ({exc}): use str, int, float, bool, None, "
                    "list or dict values") from exc


def read_json(fs: AbstractFileSystem, path: str, what: str, *, error: Type[Exception] = StorageError,
              missing_ok: bool = False, fix: str = "restore it or delete it") -> Any:
    """Read a JSON file; a damaged one raises ``error`` naming the file, never a partial value."""
    try:
        data = fs.cat_file(path)
    except FileNotFoundError:
        if missing_ok:
            return None
        raise error(f"{what} {to_url(fs, path)} does not exist") from None
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise error(f"{what} {to_url(fs, path)} is damaged (truncated or edited?): {exc}; {fix}") from exc
