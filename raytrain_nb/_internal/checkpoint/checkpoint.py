"""``Checkpoint``: a directory on any fsspec filesystem, with the API of ``ray.train.Checkpoint``.

Local paths, ``memory://`` and ``s3://`` go through the same code. A checkpoint that was
committed by :mod:`.staging` is verified against its manifest before it is loaded, so one that
was interrupted mid-write or damaged afterwards raises instead of loading half.

Example::

    ckpt = Checkpoint.from_directory("/tmp/ckpt")
    ckpt.set_metadata({"epoch": 3})
    with ckpt.as_directory() as d:
        state = torch.load(os.path.join(d, "model.pt"), weights_only=True)
"""
from __future__ import annotations

import contextlib
import os
import pickle
import shutil
import tempfile
from typing import Any, Dict, Iterator, Optional, Union

from fsspec import AbstractFileSystem

from ..errors import CheckpointError, describe
from .staging import COMMIT_MARKER, METADATA_FILE, WRITING_MARKER, verify_dir
from .storage import is_local, join, read_json, resolve, to_json, to_url, unsafe_relpath, write_bytes_atomic

PathLike = Union[str, "os.PathLike[str]"]


class Checkpoint:
    """A directory of files on a local disk or any fsspec filesystem.

    Args:
        path: a local path or an fsspec URL (``s3://bucket/run/checkpoint_000001``).
        filesystem: an fsspec filesystem (or ``pyarrow.fs.FileSystem``) to reach ``path``.

    Attributes:
        path: the path on ``filesystem`` (no protocol, as in Ray Train).
        filesystem: the fsspec filesystem.

    Raises:
        StorageError: the path or its protocol cannot be used.

    Example::

        ckpt = Checkpoint("s3://bucket/run/checkpoint_000001")
        local_dir = ckpt.to_directory()
    """

    def __init__(self, path: PathLike, filesystem: Optional[Any] = None):
        self.filesystem: AbstractFileSystem
        self.path: str
        self.filesystem, self.path = resolve(path, filesystem)

    @classmethod
    def from_directory(cls, path: PathLike) -> "Checkpoint":
        """A checkpoint of an existing directory (a local path or a URL)."""
        return cls(path)

    @property
    def url(self) -> str:
        """The path with its protocol (a plain path for local checkpoints)."""
        return to_url(self.filesystem, self.path)

    def to_directory(self, path: Optional[PathLike] = None) -> str:
        """Copy the checkpoint's files into a local directory.

        Only the files its commit manifest lists are copied (every file of a plain directory),
        and only to places inside ``path``: storage may be shared, so a name that is absolute,
        has ``..`` or resolves outside ``path`` (through a link there) is refused.

        Args:
            path: the local directory (created if needed); a new temporary one by default.

        Returns:
            The local directory.

        Raises:
            CheckpointError: the checkpoint is missing, interrupted mid-write, damaged, lists a
                file outside the destination, or the copy failed.
        """
        files = verify_dir(self.filesystem, self.path)
        made = path is None
        dest = tempfile.mkdtemp(prefix="raytrain_nb_checkpoint_") if made else \
            os.path.abspath(os.path.expanduser(os.fspath(path)))  # type: ignore[arg-type]
        os.makedirs(dest, exist_ok=True)
        if is_local(self.filesystem) and os.path.samefile(dest, self.path):
            return dest
        rels = [rel for rel in files if rel not in (COMMIT_MARKER, WRITING_MARKER)]
        try:
            dsts = [self._target(dest, rel) for rel in rels]
            for d in {os.path.dirname(d) for d in dsts}:
                os.makedirs(d, exist_ok=True)
            if rels:
                self.filesystem.get([join(self.path, rel) for rel in rels], dsts)
        except Exception as exc:
            if made:
                shutil.rmtree(dest, ignore_errors=True)
            if isinstance(exc, CheckpointError):
                raise
            raise CheckpointError(f"cannot copy checkpoint {self.url} to {dest}: {describe(exc)}") from exc
        return dest

    def _target(self, dest: str, rel: str) -> str:
        """The local path of the checkpoint file ``rel`` under ``dest``; refused unless inside ``dest``."""
        if unsafe_relpath(rel):
            raise CheckpointError(f"checkpoint {self.url} lists the file {rel!r}, which is absolute or leaves the "
                                  "checkpoint ('..'): the checkpoint cannot be trusted; load another one")
        target = os.path.join(dest, *rel.split("/"))
        real, root = os.path.realpath(target), os.path.realpath(dest)
        if not real.startswith(root.rstrip(os.sep) + os.sep):
            raise CheckpointError(f"checkpoint {self.url}: the file {rel!r} would be written to {real}, outside "
                                  f"the destination {dest}: remove the link in {dest} or pick an empty destination")
        return target

    @contextlib.contextmanager
    def as_directory(self) -> Iterator[str]:
        """A local directory with the checkpoint's files, for the ``with`` block.

        A local checkpoint is used in place (do not modify it); a remote one is copied to a
        temporary directory that is removed afterwards.

        Raises:
            CheckpointError: as :meth:`to_directory`.
        """
        if is_local(self.filesystem):
            verify_dir(self.filesystem, self.path)
            yield self.path
            return
        tmp = self.to_directory()
        try:
            yield tmp
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def _require_dir(self) -> None:
        self.filesystem.invalidate_cache(self.path)
        if not self.filesystem.isdir(self.path):
            raise CheckpointError(f"checkpoint directory {self.url} does not exist")

    def get_metadata(self) -> Dict[str, Any]:
        """The checkpoint's metadata (``{}`` if none was set).

        Raises:
            CheckpointError: the directory is missing, or its metadata file is damaged.
        """
        self._require_dir()
        data = read_json(self.filesystem, join(self.path, METADATA_FILE), "checkpoint metadata",
                         error=CheckpointError, missing_ok=True, fix="set it again with set_metadata")
        if data is None:
            return {}
        if not isinstance(data, dict):
            raise CheckpointError(f"checkpoint metadata {join(self.url, METADATA_FILE)} holds a "
                                  f"{type(data).__name__}, not a JSON object: set it again with set_metadata")
        return data

    def set_metadata(self, metadata: Dict[str, Any]) -> None:
        """Replace the metadata (a JSON-serializable dict, stored in ``.metadata.json``).

        Raises:
            CheckpointError: ``metadata`` is not a dict or holds a value JSON cannot store.
        """
        if not isinstance(metadata, dict):
            raise CheckpointError(f"metadata={metadata!r} is not a dict: pass e.g. {{'epoch': 3}}")
        text = to_json(metadata, "metadata", error=CheckpointError)
        self._require_dir()
        write_bytes_atomic(self.filesystem, join(self.path, METADATA_FILE), text.encode("utf-8"))

    def update_metadata(self, metadata: Dict[str, Any]) -> None:
        """Merge ``metadata`` into the stored metadata.

        Raises:
            CheckpointError: as :meth:`set_metadata` and :meth:`get_metadata`.
        """
        if not isinstance(metadata, dict):
            raise CheckpointError(f"metadata={metadata!r} is not a dict: pass e.g. {{'epoch': 3}}")
        merged = self.get_metadata()
        merged.update(metadata)
        self.set_metadata(merged)

    def __repr__(self) -> str:
        proto = self.filesystem.protocol
        proto = "local" if is_local(self.filesystem) else (proto[0] if isinstance(proto, (tuple, list)) else proto)
        return f"Checkpoint(filesystem={proto}, path={self.path})"

    def __getstate__(self) -> Dict[str, Any]:
        state: Dict[str, Any] = {"path": self.path, "url": self.url, "filesystem": None}
        try:
            pickle.dumps(self.filesystem)
            state["filesystem"] = self.filesystem
        except Exception:  # rebuilt from the URL on the other side
            pass
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        if state.get("filesystem") is not None:
            self.filesystem, self.path = state["filesystem"], state["path"]
        else:
            self.filesystem, self.path = resolve(state["url"])


class FrameworkCheckpoint(Checkpoint):
    """A framework's checkpoint class (``TorchCheckpoint``, ``XGBoostCheckpoint``, ...): a :class:`Checkpoint`
    with Ray Train's preprocessor accessors, which never hold one here (Ray Train deprecated them)."""

    def get_preprocessor(self) -> Any:
        """The fitted preprocessor saved with the checkpoint: always None here (none can be saved)."""
        return None

    def set_preprocessor(self, preprocessor: Any) -> None:
        """Save a fitted Ray Data preprocessor with the checkpoint: not supported.

        Raises:
            CheckpointError: naming what to do instead.
        """
        raise CheckpointError(f"{type(self).__name__}.set_preprocessor(...) is not supported (Ray Train deprecated "
                              "preprocessors in checkpoints): save what the preprocessor needs into the checkpoint "
                              "directory yourself")


def delete_local(checkpoint: Checkpoint) -> None:
    """Remove a checkpoint's directory when it is on the local disk (``report(...,
    delete_local_checkpoint_after_upload=True)``, once its files were uploaded); any other filesystem is left."""
    if is_local(checkpoint.filesystem) and os.path.isdir(checkpoint.path):
        shutil.rmtree(checkpoint.path)
