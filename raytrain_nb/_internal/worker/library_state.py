"""Per-process singletons of training libraries (Accelerate's state, Transformers' cached world size...)
that hold the old world size after a restart or rescale: reset whenever a worker's rank or size is set."""
from __future__ import annotations

import logging
import sys
from typing import Any, Callable, Dict, List

logger = logging.getLogger(__name__)

#: library module -> function resetting what it caches about the process group; called only when the
#: library is already imported (a reset never imports a library).
RESETS: Dict[str, Callable[[Any], None]] = {}


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
