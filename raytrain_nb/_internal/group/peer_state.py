"""New ranks of a group with no torch process group get a live peer's state through the driver.

A torch group copies what a replacement or new rank lacks inside its process group
(``worker/replicate.py``). XGBoost, LightGBM and ``backend="none"`` groups have none, so after they
re-form the driver does the same in three calls: every rank says what it holds, the source rank packs
what the new ranks lack (boosters trained in cells, variables such as ``epochs_done``), and the new ranks
load it. A booster a new rank rebuilt by replaying a setup cell gets the source's model loaded into it.
Names that differ by rank stay the new rank's own; a library's data handle (``DMatrix``, LightGBM's
``Dataset``) is never copied: the line said after the command asks for it to be built again.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, List, Sequence

from ..errors import RecoveryError
from ..worker.replicate import plan_transfer
from ..worker.walk import top_name

if TYPE_CHECKING:
    from .core import GroupCore

logger = logging.getLogger(__name__)


def copy_to_fresh(core: "GroupCore", src: int, fresh: Sequence[int], results: List[Any]) -> None:
    """Give the ``fresh`` ranks what rank ``src`` holds and they lack; record in ``results[r]`` (each rank's
    answer to joining) the names rank ``r`` received and those it went without.

    Raises:
        RecoveryError: an object a new rank needs cannot be pickled (naming it and the fix); the survivors
            keep their state.
        GroupError: a rank did not answer in time, died or raised.
    """
    slots = core.slots
    stock = core.collect([s.actor.peer_inventory.remote(r in fresh) for r, s in enumerate(slots)],
                         core.settings.start_timeout_s, "take stock of their state in")
    send, keep, cannot = plan_transfer(stock, src, sorted(core.rank_specific))
    handles: Dict[str, str] = stock[src]["handles"]
    rebuild = sorted(n for n in send if n in handles)
    send = [n for n in send if n not in handles]
    plain = [n for n in stock[src]["plain"] if n not in core.rank_specific]
    kept = set(keep)
    models = [p for p in stock[src]["boosters"]
              if top_name(p) in kept and all(p in stock[r]["boosters"] for r in fresh)]
    if send or plain or models:
        ref = slots[src].actor.peer_pack.remote(send, keep, plain, models)
        packed = core.collect([ref], core.settings.start_timeout_s, f"pack rank {src}'s state for the new ranks of")[0]
        if packed["problems"]:
            names = "; ".join(f"{n} ({why})" for n, why in sorted(packed["problems"].items()))
            raise RecoveryError(f"a new rank cannot get {names} from rank {src}: make them in a cell marked "
                                "--setup (%%distributed --setup), which new ranks replay")
        got = core.collect([slots[r].actor.peer_receive.remote(ref, keep) for r in fresh],
                           core.settings.start_timeout_s, f"load rank {src}'s state into the new ranks of")
    else:
        got = [[] for _ in fresh]
    for r, names in zip(fresh, got):
        if isinstance(results[r], dict):
            results[r]["received"] = list(names)
            results[r]["missing"] = list(cannot)
    for name in rebuild:
        line = (f"rank(s) {', '.join(map(str, fresh))}: {name!r} is rank {src}'s {handles[name]} (its own data), "
                "not copied: build it again in the cell that trains")
        logger.warning("%s", line)
        core.replay_failures.append(line)
    logger.debug("rank(s) %s got %d object(s), %d variable(s) and %d booster model(s) from rank %d",
                 list(fresh), len(send), len(plain), len(models), src)
