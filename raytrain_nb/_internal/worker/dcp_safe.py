"""Reading PyTorch Distributed Checkpoint (DCP) directories without unpickling code from storage.

DCP's ``FileSystemReader`` reads ``.metadata`` with ``pickle.load`` and its default load planner reads every
non-tensor item with ``torch.load(weights_only=False)``: a planted file in shared storage would run code on every
rank that loads it. :class:`SafeReader` reads ``.metadata`` with an unpickler that accepts only DCP's own metadata
classes (and the dtypes, sizes and paths they hold); :class:`SafeLoadPlanner` reads non-tensor items with
``weights_only=True``. ``allow_pickle`` (``--allow-pickle``) loosens both, for storage the user trusts.
"""
from __future__ import annotations

import io
import os
import pickle
from typing import Any, Dict, Optional, Tuple

from ..errors import SnapshotError

#: The globals a DCP ``.metadata`` pickle may name: DCP's metadata classes, the storage records of its file
#: system writer, and what those hold (dtypes, sizes, the memory-format table, the checkpoint's path).
_ALLOWED_MODULES = {
    "torch.distributed.checkpoint.metadata": None,  # every class of DCP's metadata module
    "torch.distributed.checkpoint.filesystem": {"_StorageInfo"},
    "torch.distributed.checkpoint.planner": {"LoadItemType", "WriteItemType"},
    "torch.distributed.checkpoint._extension": {"ExtensionRegistry"},
    "torch.serialization": {"_get_layout"},
    "torch": {"Size"},  # and torch's dtypes (below)
    "pathlib": {"PosixPath", "PurePosixPath", "WindowsPath", "PureWindowsPath", "Path"},
    "collections": {"OrderedDict"},
    "builtins": {"set", "frozenset", "slice", "tuple", "list", "dict"},
}


class _MetadataUnpickler(pickle.Unpickler):
    """Finds only the globals of :data:`_ALLOWED_MODULES` (and torch dtypes / layouts / memory formats)."""

    def __init__(self, fh: Any, what: str) -> None:
        super().__init__(fh)
        self.what = what

    def find_class(self, module: str, name: str) -> Any:
        allowed = _ALLOWED_MODULES.get(module, set())
        if module in _ALLOWED_MODULES and (allowed is None or name in allowed):
            return super().find_class(module, name)
        if module == "torch":
            import torch  # torch: loaded on first use, not on import raytrain_nb

            value = getattr(torch, name, None)
            if isinstance(value, (torch.dtype, torch.layout, torch.memory_format)):
                return value
        raise SnapshotError(f"{self.what} names {module}.{name}, which is not one of DCP's metadata classes: it "
                            "would run code if loaded, so nothing was loaded (load with allow_pickle=True / "
                            "--allow-pickle only if you trust this storage)")


def load_metadata(data: bytes, what: str, allow_pickle: bool = False) -> Any:
    """Unpickle a ``.metadata`` file's bytes, accepting only DCP's metadata classes (any with ``allow_pickle``).

    Raises:
        SnapshotError: the file names another class (one line, naming it), or it is damaged.
    """
    try:
        if allow_pickle:
            return pickle.loads(data)  # noqa: S301 - the user trusts this storage (--allow-pickle)
        return _MetadataUnpickler(io.BytesIO(data), what).load()
    except SnapshotError:
        raise
    except Exception as exc:  # noqa: BLE001 - any failure to read is a damaged file
        raise SnapshotError(f"{what} is truncated or damaged ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:160] if str(exc) else ''}); nothing was loaded") from None


def reader_and_planner(path: str, allow_pickle: bool = False, fs: Optional[Any] = None) -> Tuple[Any, Any]:
    """A DCP storage reader for the checkpoint directory ``path`` (local, or on ``fs``) that reads ``.metadata``
    safely, and a load planner that reads non-tensor items with ``weights_only=True``."""
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader

    class SafeReader(FileSystemReader):
        def read_metadata(self, *args: Any, **kwargs: Any) -> Any:
            # torch.distributed's checkpoint and FSDP: loaded only for sharded models
            from torch.distributed.checkpoint.metadata import StorageMeta

            meta_path = self._get_metadata_path(kwargs.get("rank"))
            with self.fs.create_stream(meta_path, "rb") as fh:
                metadata = load_metadata(fh.read(), f"{path}/.metadata", allow_pickle)
            if getattr(metadata, "storage_meta", None) is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class SafeLoadPlanner(DefaultLoadPlanner):
        def load_bytes(self, read_item: Any, value: io.BytesIO) -> None:
            import torch  # torch: loaded on first use, not on import raytrain_nb

            try:
                obj = torch.load(value, weights_only=not allow_pickle)
            except pickle.UnpicklingError as exc:
                raise SnapshotError(f"{path}: item {read_item.dest_index.fqn!r} holds objects that only load by "
                                    f"unpickling code ({str(exc).splitlines()[0][:120]}); load with "
                                    "allow_pickle=True / --allow-pickle only if you trust this storage") from None
            if self.flatten_state_dict:
                from torch.distributed.checkpoint._traverse import set_element  # as DCP's own planner does

                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    if fs is None:
        return SafeReader(path), SafeLoadPlanner()
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    class SafeFsspecReader(FsspecReader):
        read_metadata = SafeReader.read_metadata

    return SafeFsspecReader(path), SafeLoadPlanner()


def to_torch_save(dcp_dir: str, out_path: str, allow_pickle: bool = False) -> Dict[str, Any]:
    """Gather a DCP checkpoint (a sharded snapshot's ``sharded/`` folder, or one a training loop wrote) into one
    ``torch.save`` file for inference in one process, reading ``.metadata`` safely; returns the full state dict.

    This is ``torch.distributed.checkpoint.format_utils.dcp_to_torch_save`` with the safe reader: it needs memory
    for the whole model in this one process.
    """
    import torch  # torch: loaded on first use, not on import raytrain_nb
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from torch.distributed.checkpoint.default_planner import _EmptyStateDictLoadPlanner
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from torch.distributed.checkpoint.state_dict_loader import _load_state_dict

    with open(os.path.join(dcp_dir, ".metadata"), "rb") as fh:  # refused here in one line, before DCP reads it
        load_metadata(fh.read(), os.path.join(dcp_dir, ".metadata"), allow_pickle)
    reader, safe = reader_and_planner(dcp_dir, allow_pickle)

    class Planner(_EmptyStateDictLoadPlanner):
        load_bytes = type(safe).load_bytes

    state: Dict[str, Any] = {}
    _load_state_dict(state, storage_reader=reader, planner=Planner(), no_dist=True)
    torch.save(state, out_path)
    return state
