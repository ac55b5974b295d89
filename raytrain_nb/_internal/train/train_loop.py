"""The training function as a trainer runs it on each worker (through ``WorkerGroup.execute``).

Nothing here is a separate worker: the same actors, cell thread, ``report`` and
``get_checkpoint`` serve notebook cells and trainers.
"""
from __future__ import annotations

import inspect
import logging
import pickle
import sys
from typing import Any, Callable, Dict, Optional

from ..backend import process_group_state
from ..errors import ConfigError
from ..worker import session

logger = logging.getLogger(__name__)


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


def call_loop(fn: Callable[..., Any], config: Optional[Dict[str, Any]], with_config: bool,
              resume: Optional[Any], metadata: Optional[Dict[str, Any]] = None) -> Any:
    """Run the user's function in this process and return what it returns; ``get_checkpoint()`` falls back to
    ``resume``, ``get_context().get_metadata()`` returns ``metadata``.

    ``resume`` (``resume_from_checkpoint``) is returned by ``get_checkpoint()`` only while the
    run has no committed checkpoint of its own.
    """

    sess = session.current_session()
    base = sess.latest if sess is not None else None
    if sess is not None and resume is not None:
        sess.latest = lambda: (base() if base is not None else None) or resume
    if sess is not None:
        sess.metadata = dict(metadata or {})
    try:
        if with_config:
            return fn(config if config is not None else {})
        return fn()
    finally:
        if sess is not None:
            sess.latest = base
        _forget_prepared()


def run_loop(fn: Callable[..., Any], config: Optional[Dict[str, Any]], with_config: bool,
             resume: Optional[Any], metadata: Optional[Dict[str, Any]] = None,
             pg_timeout_s: Optional[float] = None) -> Optional[bytes]:
    """On a worker: run the user's function (:func:`call_loop`); rank 0 returns its return value pickled (the
    driver's ``Result.return_value``), the other ranks ``None``. ``pg_timeout_s`` (``TorchConfig(timeout_s=...)``)
    is given to the process group's collectives first.

    Raises:
        TypeError: rank 0's return value cannot be pickled (naming its type).
    """
    if pg_timeout_s is not None:
        process_group_state().set_timeout(pg_timeout_s)
    value = call_loop(fn, config, with_config, resume, metadata)
    sess = session.current_session()
    if value is None or (sess is not None and sess.context.world_rank != 0):
        return None
    from ray import cloudpickle  # ray: a worker has it loaded; a class made in the script pickles by value

    try:
        return cloudpickle.dumps(value)
    except Exception as exc:  # noqa: BLE001 - named with its cause, as the rank's error
        raise TypeError(f"the training function returned a {type(value).__name__} that cannot be pickled ({exc}): "
                        "return something picklable, or None (rank 0's return value goes to the driver as "
                        "Result.return_value)") from None


def load_return_value(payload: Optional[bytes]) -> Any:
    """On the driver: rank 0's return value from :func:`run_loop`'s bytes (``None`` stays ``None``).

    A value the driver cannot unpickle (a class it cannot import) is logged and given as ``None``: the run
    itself succeeded.
    """
    if payload is None:
        return None
    try:
        return pickle.loads(payload)
    except Exception as exc:  # noqa: BLE001 - the run succeeded; say why the value is missing
        logger.warning("Result.return_value is None: rank 0's return value cannot be unpickled here (%s: %s)",
                       type(exc).__name__, exc)
        return None


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
