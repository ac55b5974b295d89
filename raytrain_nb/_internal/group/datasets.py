"""Ray Data datasets split across a group's ranks; ``get_dataset_shard(name)`` on each worker.

The driver splits every dataset with ``streaming_split(num_workers, equal=True)`` and hands each
rank its ``DataIterator`` (a small picklable handle to Ray Data's split coordinator). The same
path serves ``TorchTrainer(datasets=...)``, ``group.attach_datasets(...)`` and
``%%distributed --datasets train=ds``. After a restart or a rescale the datasets are split again
for the new world size (the group's state observer sees RECOVERING -> IDLE); a trainer also splits
again before each attempt (:func:`ensure_fresh`), since a split abandoned mid-epoch cannot be reused.

Example::

    group.attach_datasets(train=ray.data.range(1000))
    group.run("it = raytrain_nb.get_dataset_shard('train')")
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional

from ..errors import GroupError
from ..worker.session import set_shards
from .state import GroupState

if TYPE_CHECKING:  # the group calls in here; this module never imports it at run time
    from .group import WorkerGroup

logger = logging.getLogger(__name__)

def split(datasets: Dict[str, Any], n: int, data_config: Optional[Any] = None,
          node_ids: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """Each rank's iterators: what ``data_config.configure(...)`` makes of them (Ray Train's hook, which a
    ``DataConfig`` subclass may override), or without a config :func:`split_datasets` of every dataset."""
    if data_config is not None:
        return data_config.configure(datasets, world_size=n, worker_handles=None, worker_node_ids=node_ids)
    return split_datasets(datasets, n, lambda name: True)


def split_datasets(datasets: Dict[str, Any], n: int, splits: Callable[[str], bool],
                   locality_hints: Optional[List[str]] = None) -> List[Dict[str, Any]]:
    """Each rank's iterators: ``streaming_split(n, equal=True)`` (with the ranks' node ids as locality hints,
    when given) where ``splits(name)``, else the whole dataset."""
    per_rank: List[Dict[str, Any]] = [{} for _ in range(n)]
    for name, ds in datasets.items():
        if splits(name):
            parts = ds.streaming_split(n, equal=True, locality_hints=locality_hints)
        else:
            parts = [ds.iterator()] * n
        for rank in range(n):
            per_rank[rank][name] = parts[rank]
    return per_rank


def check_datasets(datasets: Any, where: str = "datasets") -> Dict[str, Any]:
    """Validate ``{name: ray.data.Dataset}``.

    Raises:
        GroupError: not a dict of Ray Data datasets (naming the key and its type).
    """
    if datasets is None:
        return {}
    if not isinstance(datasets, dict):
        raise GroupError(f"{where}={type(datasets).__name__}: pass a dict such as {{'train': ray.data.Dataset}}")
    try:
        from ray.data import Dataset  # ray: loaded when a group or trainer runs, not on import raytrain_nb
    except ImportError as exc:  # pragma: no cover - ray[data] missing
        raise GroupError(f"{where} needs Ray Data: pip install 'raytrain_nb[data]' ({exc})") from exc
    for name, ds in datasets.items():
        if not isinstance(name, str) or not name:
            raise GroupError(f"{where}: dataset name {name!r} is not a non-empty string")
        if not isinstance(ds, Dataset):
            raise GroupError(f"{where}[{name!r}] is a {type(ds).__name__}, not a ray.data.Dataset: build it "
                             "with ray.data.from_items/from_numpy/read_* (a torch DataLoader goes through "
                             "prepare_data_loader inside the loop instead)")
    return dict(datasets)


@dataclasses.dataclass
class _Attachment:
    datasets: Dict[str, Any]
    data_config: Optional[Any]
    world_size: int = 0
    used: bool = False
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)


_ATTACHED: "weakref.WeakKeyDictionary[Any, _Attachment]" = weakref.WeakKeyDictionary()


def attach(group: "WorkerGroup", datasets: Dict[str, Any], data_config: Optional[Any] = None) -> None:
    """Split ``datasets`` across ``group``'s ranks now, and again after every restart or rescale.

    Raises:
        GroupError: bad datasets; or the group is busy or has dead ranks.
    """
    datasets = check_datasets(datasets)
    first = group not in _ATTACHED
    att = _Attachment(datasets=datasets, data_config=data_config)
    _ATTACHED[group] = att
    if first:
        ref = weakref.ref(group)
        group.subscribe(lambda old, new: _on_state(ref, old, new))
    _resplit(group, att)


def _resplit(group: "WorkerGroup", att: _Attachment) -> None:
    with att.lock:
        n = group.num_workers
        node_ids = [slot.info.get("node_id") for slot in group.slots]
        per_rank = split(att.datasets, n, att.data_config, node_ids if all(node_ids) else None) \
            if att.datasets else [{} for _ in range(n)]
        group.execute(set_shards, per_rank, output="none")
        att.world_size, att.used = n, False
        logger.debug("datasets %s split %d ways", sorted(att.datasets), n)


def ensure_fresh(group: "WorkerGroup") -> None:
    """Before a trainer's attempt: split again unless the current split was never used."""
    att = _ATTACHED.get(group)
    if att is None:
        return
    if att.used or att.world_size != group.num_workers:
        _resplit(group, att)
    att.used = True


def _on_state(ref: "weakref.ref[Any]", old: Any, new: Any) -> None:
    group = ref()
    att = _ATTACHED.get(group) if group is not None else None
    if att is None or not (old is GroupState.RECOVERING and new is GroupState.IDLE):
        return
    try:
        _resplit(group, att)
    except Exception as exc:  # noqa: BLE001 - the next get_dataset_shard names the missing shard
        logger.warning("could not split the datasets again after the group changed: %s", exc)
