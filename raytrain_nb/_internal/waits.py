"""Driver-side waits with a deadline that say what they wait for (Ray results, events, threads).

Every wait on the driver goes through a call with a timeout (``tests/unit/test_deadlines.py`` checks
it). The helpers here add what a bare timeout lacks: a wait that lasts longer than
:data:`SAY_AFTER_S` logs, at INFO on the caller's logger, ``waiting for <what> (<n> s so far,
deadline <d> s)``, again each time its length doubles; and a wait that runs out names who did
not answer. Deadlines themselves are the caller's (``group/timing.py`` holds the group's).
"""
from __future__ import annotations

import logging
import threading
import time
from typing import Any, Callable, List, Optional, Sequence, Tuple, Type

from .errors import GroupError

logger = logging.getLogger(__name__)

#: A wait that has lasted this long says, at INFO, what it waits for (then again at 2x, 4x, ... this).
SAY_AFTER_S = 5.0
#: ``ray.get`` of a result that is already ready (and local) only deserializes it.
FETCH_S = 30.0


def wait_until(step: Callable[[float], bool], deadline_s: Optional[float], what: str,
               log: logging.Logger = logger) -> bool:
    """Call ``step(slice_s)`` until it returns True, or until ``deadline_s`` seconds have passed.

    ``step`` must block at most ``slice_s`` seconds and return whether the awaited thing happened,
    e.g. ``event.wait`` (``wait_until(done.wait, 30, "the writer thread")``).

    Args:
        step: one bounded wait; called at least once, also with a deadline of 0.
        deadline_s: seconds in all; ``None`` waits until ``step`` says done, for waits on the
            user's own code only (a cell that trains for hours), whose ranks other deadlines watch.
        what: what is awaited, as a noun phrase for "waiting for <what>" ("every rank to answer").
        log: the caller's module logger, which says what is awaited once the wait passes 5 s.

    Returns:
        True when ``step`` said done, False when the deadline passed first (the caller raises).
    """
    start = time.monotonic()
    say_at = SAY_AFTER_S
    while True:
        elapsed = time.monotonic() - start
        slice_s = say_at - elapsed
        if deadline_s is not None:
            slice_s = min(slice_s, deadline_s - elapsed)
        if step(max(slice_s, 0.0)):
            return True
        elapsed = time.monotonic() - start
        if deadline_s is not None and elapsed >= deadline_s:
            return False
        if elapsed >= say_at:
            limit = "no deadline" if deadline_s is None else f"deadline {deadline_s:g} s"
            log.info("waiting for %s (%.0f s so far, %s)", what, elapsed, limit)
            while say_at <= elapsed:
                say_at *= 2


def join_within(thread: threading.Thread, deadline_s: float, what: str, log: logging.Logger = logger) -> bool:
    """``thread.join`` with :func:`wait_until`'s deadline and progress log; True when the thread ended."""
    def step(slice_s: float) -> bool:
        thread.join(timeout=slice_s)
        return not thread.is_alive()

    return wait_until(step, deadline_s, what, log)


def wait_within(refs: Sequence[Any], deadline_s: float, what: str,
                log: logging.Logger = logger) -> Tuple[List[Any], List[Any]]:
    """Wait for every Ray object ref in ``refs`` at once, under one deadline for all of them.

    A dead or stopped worker thus costs one deadline, not one per ref. Logs as :func:`wait_until`.
    Never raises on the deadline and never fetches a result: see :func:`get_within` for that.

    Returns:
        ``(ready, late)``: the refs that are ready and those that were not by the deadline, each
        in the order of ``refs``.
    """
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    pending = list(dict.fromkeys(refs))  # ray.wait takes each ref once

    def step(slice_s: float) -> bool:
        nonlocal pending
        if pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=slice_s)
        return not pending

    wait_until(step, deadline_s, what, log)
    late = set(pending)
    return [r for r in refs if r not in late], [r for r in refs if r in late]


def get_within(refs: Sequence[Any], deadline_s: float, what: str, *, labels: Optional[Sequence[str]] = None,
               hint: str = "check `ray status` and the workers' logs", error: Type[Exception] = GroupError,
               log: logging.Logger = logger) -> List[Any]:
    """``ray.get(refs)`` with one deadline for all of them, a progress log, and a clear error.

    Args:
        refs: Ray object refs (e.g. one actor call per rank, all submitted before this call).
        deadline_s: seconds for all of them together (a constant of ``group/timing.py``).
        what: what is awaited, as a noun phrase ("every rank to accept the snapshot request").
        labels: one name per ref ("rank 1"), to say who did not answer; default: how many.
        hint: what the user can do when the deadline passes.
        error: the exception class raised when it passes.
        log: the caller's module logger (see :func:`wait_until`).

    Returns:
        The results, in the order of ``refs``.

    Raises:
        error: some refs were not ready by the deadline, e.g. ``GroupError: gave up waiting for
            every rank to answer after 5 s (no answer from rank 1): check `ray status` ...``.
        ray.exceptions.RayActorError, RayTaskError: as ``ray.get`` raises them (a worker died, a
            call raised); callers turn them into their own errors.
    """
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    refs = list(refs)
    _, late = wait_within(refs, deadline_s, what, log)
    if late:
        late_set = set(late)
        who = ", ".join(labels[i] for i, ref in enumerate(refs) if ref in late_set) if labels \
            else f"{len(late)} of {len(refs)}"
        raise error(f"gave up waiting for {what} after {deadline_s:g} s (no answer from {who}): {hint}")
    return ray.get(refs, timeout=FETCH_S) if refs else []
