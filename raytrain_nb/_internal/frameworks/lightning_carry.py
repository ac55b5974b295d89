"""A LightningModule's optimizer state from one ``fit`` to the next in a warm worker.

Lightning builds new optimizers at every ``fit`` (``configure_optimizers``). On the warm group a
second ``fit`` of the same module in a later cell continues: the optimizers the module's previous
``fit`` made are remembered (weakly, by module), and their per-parameter state (momentum, Adam's
moments and step) is loaded into the new ones when they are of the same kinds and shapes. The
hyperparameters of the new ones (learning rate, weight decay...) and their LR schedulers are this
``fit``'s own, from ``configure_optimizers``: a new schedule, as Transformers' ``train()`` starts one.
The ranks agree first (an all-gather of who can carry): where only some can (a rank that joined
in a rescale has no previous fit), the lowest such rank sends its state to all, so no rank steps
with an optimizer state its peers do not have.
"""
from __future__ import annotations

import weakref
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.distributed as dist

#: LightningModule -> the optimizers its last fit in this process made.
_PREVIOUS: "weakref.WeakKeyDictionary[Any, List[Any]]" = weakref.WeakKeyDictionary()


def remember_optimizers(module: Any, optimizers: Sequence[Any]) -> None:
    """Keep the optimizers of ``module``'s fit now starting (for its next fit)."""
    _PREVIOUS[module] = list(optimizers)


def forget_optimizers(module: Any) -> None:
    """The next fit of ``module`` starts with fresh optimizers (on this rank)."""
    _PREVIOUS.pop(module, None)


def _signature(optimizers: Sequence[Any]) -> List[Any]:
    """The kinds and parameter shapes of optimizers: equal where state can be carried."""
    return [(type(o).__qualname__, [[tuple(p.shape) for p in g["params"]] for g in o.param_groups])
            for o in optimizers]


def _copy(obj: Any, to_cpu: bool = False) -> Any:
    """A state dict with its own tensors (the new optimizer must not share the old one's), on the CPU if asked."""
    if isinstance(obj, torch.Tensor):
        return obj.detach().to("cpu", copy=True) if to_cpu else obj.detach().clone()
    if isinstance(obj, dict):
        return {k: _copy(v, to_cpu) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_copy(v, to_cpu) for v in obj)
    return obj


def _saved(module: Any) -> Optional[Dict[str, Any]]:
    previous = _PREVIOUS.get(module)
    if previous is None:
        return None
    return {"signature": _signature(previous), "states": [o.state_dict()["state"] for o in previous]}


def carry_optimizer_state(module: Any, optimizers: Sequence[Any], from_peer: bool = True) -> str:
    """Load the per-parameter state of ``module``'s previous optimizers into ``optimizers``.

    A collective where the process group has several ranks: every rank calls it. Returns what was
    carried (``"SGD"``), or ``""`` when no rank had a matching previous fit. Without ``from_peer``
    (a sharded module: each rank's state is its own shards) it is carried only when every rank has it.
    """
    want = _signature(optimizers)
    saved = _saved(module)
    usable = saved is not None and saved["signature"] == want
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        everyone: List[Any] = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, usable)
        if not any(everyone) or (not from_peer and not all(everyone)):
            return ""
        if not all(everyone):  # a rank without it (joined in a rescale): the lowest that has it sends it
            src = everyone.index(True)
            box = [_copy(saved, to_cpu=True) if dist.get_rank() == src else None]
            dist.broadcast_object_list(box, src=src)
            saved, usable = box[0], True
    if not usable or saved is None:
        return ""
    for optimizer, state in zip(optimizers, saved["states"]):
        # this fit's hyperparameters (param_groups), the previous fit's per-parameter state
        optimizer.load_state_dict({"state": _copy(state), "param_groups": optimizer.state_dict()["param_groups"]})
    return ", ".join(type(o).__name__ for o in optimizers)
