"""A cheap key for what a cell may have changed of a rank's sharded models, so the full look runs only on change.

Telling the driver whether a rank's sharded models stepped since their mirror (:meth:`MirroringWorker._shards_stepped`)
walks the namespace and every module's parameters: a tenth of a millisecond for a small model, milliseconds for a
large one, at the end of every cell. Its answer can only change when an optimizer stepped (counted by a global step
hook), the mirror was taken again, something other than a cell ran on the cell thread (a rollback, a re-shard...), or
the objects the names hold changed (another object, another class: ``fully_shard`` changes a module's class, a new
model or optimizer is a new object, one level into dicts, lists and tuples included). The key covers all of these.
"""
from __future__ import annotations

import sys
from typing import Any, Dict, Hashable, List, Tuple

#: Optimizer steps taken in this process since the hook was installed (a one-item list: the hook adds to it).
_STEPS: List[int] = [0]
_HOOKED: List[bool] = [False]

_PLAIN = (int, float, complex, str, bytes, bool, type(None))

#: Items of a container whose identities the key takes in (a longer one is keyed by its first ones and its length).
ITEMS = 64


def _count_step(optimizer: Any, args: Any, kwargs: Any) -> None:
    _STEPS[0] += 1


def steps_taken() -> int:
    """Optimizer steps taken in this process since the first call (the global step hook is installed then)."""
    if not _HOOKED[0]:
        torch_optim = sys.modules.get("torch.optim.optimizer")
        if torch_optim is None:
            return -1  # torch is not loaded: no optimizer exists, and the caller looks in full anyway
        torch_optim.register_optimizer_step_post_hook(_count_step)
        _HOOKED[0] = True
    return _STEPS[0]


def _entry(value: Any) -> Hashable:
    if isinstance(value, dict):
        items = list(value.values())
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        return (id(value), type(value))
    return (id(value), type(value), len(items), tuple((id(v), type(v)) for v in items[:ITEMS]))


def namespace_shape(namespace: Dict[str, Any]) -> Tuple[Hashable, ...]:
    """The identities and classes of the objects the names hold (plain values left out: they hold no model)."""
    return tuple((name, _entry(value)) for name, value in namespace.items() if not isinstance(value, _PLAIN))
