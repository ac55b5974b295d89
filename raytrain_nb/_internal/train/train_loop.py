"""The training function as a trainer runs it on each worker (through ``WorkerGroup.execute``).

Nothing here is a separate worker: the same actors, cell thread, ``report`` and
``get_checkpoint`` serve notebook cells and trainers.
"""
from __future__ import annotations

import inspect
import sys
from typing import Any, Callable, Dict, Optional

from ..backend import process_group_state
from ..errors import ConfigError
from ..worker import session


def takes_config(fn: Callable[..., Any], what: str = "train_loop_per_worker") -> bool:
    """Whether ``fn`` takes the config dict (one parameter) or nothing, as Ray Train decides.

    Raises:
        ConfigError: ``fn`` is not callable or takes more than one parameter.
    """
    if not callable(fn):
        raise ConfigError(f"{what}={fn!r} is not a function: pass def train_func(config): ...")
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return True
    if len(params) > 1:
        raise ConfigError(f"{what}={getattr(fn, '__name__', fn)!r} takes {len(params)} parameters "
                          f"({', '.join(params)}): it must take none or one (the train_loop_config dict)")
    return len(params) == 1


def run_loop(fn: Callable[..., Any], config: Optional[Dict[str, Any]], with_config: bool,
             resume: Optional[Any]) -> None:
    """On a worker: run the user's function; ``get_checkpoint()`` falls back to ``resume``.

    ``resume`` (``resume_from_checkpoint``) is returned by ``get_checkpoint()`` only while the
    run has no committed checkpoint of its own.
    """

    sess = session.current_session()
    base = sess.latest if sess is not None else None
    if sess is not None and resume is not None:
        sess.latest = lambda: (base() if base is not None else None) or resume
    try:
        if with_config:
            fn(config if config is not None else {})
        else:
            fn()
    finally:
        if sess is not None:
            sess.latest = base
        _forget_prepared()


def _forget_prepared() -> None:
    """Stop tracking the DDP wrappers and samplers this attempt made with ``prepare_model`` /
    ``prepare_data_loader``.

    The core re-binds tracked wrappers whenever the process group is re-formed (a collective on
    every rank). A failed attempt's model may outlive it for a while (reference cycles through its
    traceback); a replacement rank never had it, so re-binding it would wait for that rank forever.
    A trainer's attempt owns its objects: the next attempt builds its own.
    """
    if "torch" not in sys.modules:
        return

    process_group_state().forget_tracked()
