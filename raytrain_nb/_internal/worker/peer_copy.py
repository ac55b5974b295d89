"""A live peer's state for new ranks of a group with no torch process group (XGBoost, LightGBM, ``backend="none"``).

The plan is :mod:`.replicate`'s (:func:`~.replicate.plan_transfer`: what a new rank lacks, what it holds
alike, what differs by rank), carried through the driver instead of a torch broadcast: the driver asks
every rank what it holds (:func:`inventory`), the source rank packs what the new ranks need
(:func:`pack`), and each new rank loads it (:func:`receive`). Boosters that a new rank rebuilt under the
same name (a setup cell replayed) get the source's model loaded into them, in place. A library's data
handle (XGBoost's ``DMatrix``, LightGBM's ``Dataset``) holds one rank's own shard and is never copied:
the new rank builds its own in the cell that trains, as docs/xgboost_lightgbm.md says.
"""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Sequence

from . import boosters, transfer
from .replicate import inventory as replicated_inventory
from .snapshot import find_tracked
from .walk import top_name

#: Classes (module.qualname) whose objects hold one rank's data inside a library: a peer's copy is wrong.
DATA_HANDLES = {
    "xgboost.core.DMatrix": "XGBoost DMatrix",
    "lightgbm.basic.Dataset": "LightGBM Dataset",
}


def data_handle(obj: Any) -> str:
    """What kind of library data handle ``obj`` is (``XGBoost DMatrix``...), or ``""`` for anything else."""
    if isinstance(obj, type):
        return ""
    for klass in type(obj).__mro__:  # QuantileDMatrix is a DMatrix
        kind = DATA_HANDLES.get(f"{klass.__module__}.{klass.__qualname__}")
        if kind:
            return kind
    return ""


def inventory(namespace: Dict[str, Any], fresh: bool) -> Dict[str, Any]:
    """What this rank holds (as :mod:`.replicate` takes stock), its boosters and its data handles by name."""
    mine = replicated_inventory(namespace, fresh)
    mine["boosters"] = sorted(find_tracked(namespace, strict=False).boosters)
    mine["handles"] = {n: kind for n, v in namespace.items() if not n.startswith("_") and (kind := data_handle(v))}
    return mine


def pack(namespace: Dict[str, Any], send: Sequence[str], keep: Sequence[str], plain: Sequence[str],
         models: Sequence[str], shards: Dict[str, Any]) -> Dict[str, Any]:
    """On the source rank: ``send`` pickled together (``keep`` as references to the new rank's own objects),
    the ``plain`` variables' values and the saved model of each booster in ``models``.

    Returns ``{"payload", "problems" (name -> why it cannot be pickled), "plain", "models"}``."""
    payload, problems = transfer.pack(namespace, list(send), transfer.reference_tokens(namespace, keep, shards))
    held = find_tracked(namespace, strict=False).boosters
    return {"payload": payload, "problems": problems, "plain": {n: namespace[n] for n in plain if n in namespace},
            "models": {path: boosters.model_bytes(held[path]) for path in models if path in held}}


def receive(namespace: Dict[str, Any], packed: Dict[str, Any], keep: Sequence[str], shards: Dict[str, Any],
            deferred_ddp: Callable[..., Any]) -> List[str]:
    """On a new rank: load what :func:`pack` made; returns the names received (boosters loaded in place too).

    Raises:
        KeyError: a reference names an object this rank does not have.
    """
    received = transfer.unpack(packed["payload"], namespace, keep, shards, deferred_ddp) if packed["payload"] else {}
    namespace.update(received)
    namespace.update(packed["plain"])
    held = find_tracked(namespace, strict=False).boosters
    for path, data in packed["models"].items():
        boosters.load_into(held[path], data)
    return sorted(set(received) | set(packed["plain"]) | {top_name(p) for p in packed["models"]})
