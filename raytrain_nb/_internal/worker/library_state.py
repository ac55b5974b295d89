"""Per-process singletons of training libraries (Accelerate's state, Transformers' cached world size...)
that hold the old world size after a restart or rescale: reset whenever a worker's rank or size is set."""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Dict, List

logger = logging.getLogger(__name__)

#: Where a rank's numbers live in Accelerate's shared state (``PartialState`` / ``AcceleratorState``).
_ACCELERATE_FIELDS = (("num_processes", "world_size"), ("process_index", "world_rank"),
                      ("local_process_index", "local_rank"))


def library_env(backend: str, cuda: bool) -> Dict[str, str]:
    """Environment variables that make Accelerate (and so Transformers' ``Trainer``) use the group.

    Accelerate joins a torch.distributed group only on an accelerator unless told the run is on the CPU
    (``accelerate launch --cpu`` sets ``ACCELERATE_USE_CPU``): without it, a CPU worker's ``Accelerator()``
    trains alone. ``ACCELERATE_TORCH_DEVICE`` is the worker's device, as Ray Train sets it.
    """
    if backend == "none":
        return {}
    if cuda:
        return {"ACCELERATE_TORCH_DEVICE": "cuda:0"}
    return {"ACCELERATE_USE_CPU": "true", "ACCELERATE_TORCH_DEVICE": "cpu"}


def reset_accelerate(context: Any) -> None:
    """Point Accelerate's shared state at the new rank and size, in place.

    ``PartialState`` and ``AcceleratorState`` are Borg singletons: every ``Accelerator``, every
    ``TrainingArguments.distributed_state`` (so ``args.world_size``) and a ``Trainer`` made before the
    rescale read these dicts, so updating them keeps those objects right. The process group itself is
    re-formed by the group (the same default group Accelerate uses). A state that was not distributed
    (made without the group) is cleared instead: the next ``Accelerator()`` builds it on the group.
    """
    state = sys.modules["accelerate.state"]
    shared = [state.PartialState._shared_state, state.AcceleratorState._shared_state]
    for values in shared:
        if not values:
            continue
        kind = values.get("distributed_type")
        if getattr(kind, "value", kind) in (None, "NO") or "num_processes" not in values:
            state.AcceleratorState._reset_state(reset_partial_state=True)
            return
        for field, attr in _ACCELERATE_FIELDS:
            values[field] = int(getattr(context, attr))


def reset_lightning_rank(context: Any) -> None:
    """``rank_zero_only.rank``, which Lightning caches process-wide (set on import from ``RANK``)."""
    sys.modules["lightning_utilities.core.rank_zero"].rank_zero_only.rank = int(context.world_rank)


#: library module -> function resetting what it caches about the process group; called only when the
#: library is already imported (a reset never imports a library).
RESETS: Dict[str, Callable[[Any], None]] = {
    "accelerate.state": reset_accelerate,
    "lightning_utilities.core.rank_zero": reset_lightning_rank,
}


def reset_library_state(context: Any) -> List[str]:
    """Reset the cached distributed state of every imported library in :data:`RESETS`; returns their names.

    ``context`` is the worker's new :class:`~.session.TrainContext`. A reset that fails is logged and
    the others still run: a stale cache must not stop the group from forming.
    """
    done = []
    for module, reset in RESETS.items():
        if module in sys.modules:
            try:
                reset(context)
                done.append(module)
            except Exception:  # noqa: BLE001 - one library's reset must not stop re-forming
                logger.warning("could not reset %s's distributed state", module, exc_info=True)
    return done
