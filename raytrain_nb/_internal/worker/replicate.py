"""Bring every rank's replicated state in line with one rank's, after a process group (re)forms.

Used after an interrupt or a divergent error (ranks stopped at different
points of a step), when a replacement rank joins (it rebuilt its objects by
replaying setup cells but has fresh values), and when the group is rescaled.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Sequence, Tuple

from ..errors import SnapshotError
from .snapshot import find_tracked, fingerprint

logger = logging.getLogger(__name__)


def _shapes(module: Any) -> List[Tuple[str, Tuple[int, ...], str]]:
    return [(k, tuple(v.shape), str(v.dtype)) for k, v in module.state_dict().items()]


def sync_replicated(namespace: Dict[str, Any], src: int, fresh: bool,
                    rank_specific: Sequence[str] = ()) -> Dict[str, int]:
    """Broadcast rank ``src``'s modules, optimizers, schedulers and scalers to every rank.

    Only objects every rank has under the same name (and, for modules, the same
    parameter shapes) are synchronised. A ``fresh`` rank (a replacement or a new
    rank) also receives rank ``src``'s plain variables (``step``, ``epoch``...),
    except the ``rank_specific`` ones (seen to differ across ranks, like
    ``rank``): those stay the fresh rank's own.

    Returns:
        Counts of what was synchronised, by kind.
    """
    import torch  # torch: loaded on first use, not on import raytrain_nb
    import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

    try:
        tracked = find_tracked(namespace)
    except SnapshotError as exc:  # an optimizer of an unnamed model: sync the rest
        logger.warning("%s", exc)
        tracked = find_tracked({k: v for k, v in namespace.items() if not isinstance(v, torch.optim.Optimizer)})
    mine = {
        "modules": {n: _shapes(m) for n, m in tracked.modules.items()},
        "optimizers": sorted(tracked.optimizers),
        "schedulers": sorted(tracked.schedulers),
        "scalers": sorted(tracked.scalers),
        "plain": sorted(fingerprint(namespace)),
        "names": sorted(k for k in namespace if not k.startswith("_")),
        "fresh": fresh,
    }
    everyone: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    ref = everyone[src]
    counts = {"modules": 0, "objects": 0, "variables": 0}
    for name, shapes in sorted(ref["modules"].items()):
        if all(e["modules"].get(name) == shapes for e in everyone):
            with torch.no_grad():
                for tensor in tracked.modules[name].state_dict().values():
                    dist.broadcast(tensor, src=src)
            counts["modules"] += 1
        else:
            logger.warning("model %r differs across ranks; not synchronised", name)
    stateful = {**tracked.optimizers, **tracked.schedulers, **tracked.scalers}
    for kind in ("optimizers", "schedulers", "scalers"):
        for name in ref[kind]:
            if all(name in e[kind] for e in everyone):
                box = [stateful[name].state_dict() if dist.get_rank() == src else None]
                dist.broadcast_object_list(box, src=src)
                if dist.get_rank() != src:
                    stateful[name].load_state_dict(box[0])
                counts["objects"] += 1
    skip = set(rank_specific)
    wanted = sorted(n for n in ref["plain"] if n not in skip) if any(e["fresh"] for e in everyone) else []
    if wanted:
        box = [{n: namespace[n] for n in wanted} if dist.get_rank() == src else None]
        dist.broadcast_object_list(box, src=src)
        if fresh:
            namespace.update(box[0])
        counts["variables"] = len(wanted)
    return counts
