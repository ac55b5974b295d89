"""Waiting for a collective step of every rank (forming, joining, re-binding), with a liveness check.

A collective step ends on every rank or on none: a rank that is doing something else while its
peers wait in the step, that finished while they still wait, or that stopped answering, would
leave them waiting for ever. The wait checks this every :data:`~.timing.STEP_CHECK_S` and ends in
seconds with an error naming the rank and what it did instead, after breaking the process group so
the waiting ranks return; the step's deadline bounds the rest.
"""
from __future__ import annotations

import logging
import time
from typing import Any, Dict, List, Sequence

from ..backend import FORM_TIMEOUT_S, FORMING
from ..errors import GroupError, RecoveryError, first_line
from ..waits import SAY_AFTER_S
from .slots import Slot
from .timing import CONTROL_CALL_S, STEP_CHECK_S, STEP_GRACE_S

logger = logging.getLogger(__name__)

_STEP_WORDS = {"_setup": "form the process group", "_join": "re-form the process group"}


def _raise_for(exc: BaseException, what: str) -> None:
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    if isinstance(exc, ray.exceptions.RayActorError):
        raise GroupError(f"a worker died while trying to {what}: {first_line(exc)}") from None
    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, GroupError):
        raise type(cause)(first_line(cause)) from None
    raise GroupError(f"the workers could not {what}: {type(cause).__name__}: {first_line(cause)}") from None


def _activities(slots: Sequence[Slot], ranks: Sequence[int]) -> Dict[int, Any]:
    """What each rank's cell thread does now; a rank that does not answer in time is left out."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    refs = {r: slots[r].actor.activity.remote() for r in ranks}
    ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=CONTROL_CALL_S)
    out: Dict[int, Any] = {}
    for r, ref in refs.items():
        if ref in ready:
            try:
                out[r] = ray.get(ref, timeout=CONTROL_CALL_S)
            except Exception:  # noqa: BLE001 - a dead rank: its step's ref fails and says so
                pass
    return out


def _release(slots: Sequence[Slot]) -> None:
    """Break every rank's process group so ranks blocked in the step return."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    refs = [s.actor.release.remote() for s in slots]
    ray.wait(refs, num_returns=len(refs), timeout=CONTROL_CALL_S)


def await_settled(slots: Sequence[Slot], deadline_s: float) -> None:
    """Before a new formation: wait until no rank is still in an earlier, failed one (a rank whose peer died
    while it connected gives up within the worker's formation timeout). Ranks still forming are released
    first, so they give up at once where they can.

    Raises:
        GroupError: a rank is still in the earlier formation after ``deadline_s``, naming it.
    """
    start = time.monotonic()
    released = False
    while True:
        busy = [r for r, act in _activities(slots, range(len(slots))).items() if act.get("call") in _STEP_WORDS]
        if not busy:
            return
        if not released:
            released = True
            _release([slots[r] for r in busy])
        if time.monotonic() - start > deadline_s:
            raise GroupError(f"rank(s) {', '.join(map(str, busy))} are still in an earlier formation of the process "
                             f"group after {deadline_s:g} s: %dist_status shows them; %dist_restart replaces them")
        time.sleep(STEP_CHECK_S)


def await_step(slots: Sequence[Slot], refs: List[Any], step: str, deadline_s: float,
               silent_s: float) -> List[Any]:
    """The results of ``refs`` (one per rank of ``slots``, each the call ``step`` on that rank).

    Raises:
        RecoveryError: a rank is not in the step while its peers are, finished it while they still
            wait, or has not answered for ``silent_s``; the process group is broken first.
        GroupError: a rank died or raised, or the step did not end within ``deadline_s``.
    """
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    what = _STEP_WORDS.get(step, step)
    start = time.monotonic()
    pending = list(refs)
    first_done = None
    odd: Dict[int, float] = {}  # rank -> since when it is not in the step
    last_answer = {r: start for r in range(len(slots))}
    said = False
    while pending:
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=STEP_CHECK_S)
        for ref in ready:
            try:
                ray.get(ref, timeout=CONTROL_CALL_S)
            except Exception as exc:  # noqa: BLE001 - a rank failed: the step cannot end
                if pending:
                    _release(slots)
                _raise_for(exc, what)
        if not pending:
            break
        now = time.monotonic()
        if ready and first_done is None:
            first_done = now
        waiting = [i for i, ref in enumerate(refs) if ref in pending]
        if now - start >= STEP_GRACE_S:
            problem = _check(slots, waiting, step, now, first_done, odd, last_answer, silent_s, start)
            if problem:
                _release(slots)
                raise RecoveryError(f"could not {what}: {problem}; the group's process group was broken so "
                                    "no rank waits: run the command again (%dist_restart or %dist_rescale)")
        if now - start > deadline_s:
            _release(slots)
            raise GroupError(f"the workers did not {what} within {deadline_s:g} s (rank(s) "
                             f"{', '.join(map(str, waiting))} still in it); raise start_timeout_s or check `ray status`")
        if not said and now - start > SAY_AFTER_S:
            said = True
            logger.info("waiting for rank(s) %s to %s (%.0f s so far, deadline %g s)",
                        ", ".join(map(str, waiting)), what, now - start, deadline_s)
    return ray.get(refs, timeout=CONTROL_CALL_S)


def _check(slots: Sequence[Slot], waiting: List[int], step: str, now: float, first_done: Any,
           odd: Dict[int, float], last_answer: Dict[int, float], silent_s: float, started: float) -> str:
    """What is wrong with the ranks still in the step, or ""."""
    done = [r for r in range(len(slots)) if r not in waiting]
    if first_done is not None and now - first_done >= STEP_GRACE_S:
        return (f"rank(s) {', '.join(map(str, done))} finished while rank(s) {', '.join(map(str, waiting))} "
                f"still wait in it (a protocol error)")
    answers = _activities(slots, waiting)
    forming = [r for r in waiting if (answers.get(r) or {}).get("phase") == FORMING]
    if forming and len(forming) == len(waiting) and now - started >= FORM_TIMEOUT_S + STEP_GRACE_S:
        return (f"every rank waited {now - started:.0f} s to form the process group (it takes seconds; "
                f"a worker gives up after {FORM_TIMEOUT_S:g} s)")
    for rank in waiting:
        act = answers.get(rank)
        if act is None:
            if now - last_answer[rank] >= silent_s:
                return f"rank {rank} has not answered for {now - last_answer[rank]:.0f} s (stopped or hung)"
            continue
        last_answer[rank] = now
        if act.get("call") == step:
            odd.pop(rank, None)
            continue
        since = odd.setdefault(rank, now)
        if now - since >= STEP_GRACE_S:
            doing = f"running {act['call']}" if act.get("call") else "idle"
            return f"rank {rank} is {doing}, not in the step, while its peers wait in it (a protocol error)"
    return ""
