"""Waiting for a collective step of every rank (forming, joining, re-binding), with a liveness check.

A collective step ends on every rank or on none: a rank that is doing something else while its
peers wait in the step, that finished while they still wait, or that stopped answering, would
leave them waiting for ever. The wait checks this every :data:`~.timing.STEP_CHECK_S` and ends in
seconds with an error naming the rank and what it did instead, after breaking the process group so
the waiting ranks return; the step's deadline bounds the rest.
"""
from __future__ import annotations

import logging
import re
import time
from typing import Any, Dict, List, Sequence, Set

from ..backend import FORM_TIMEOUT_S, FORMING
from ..errors import GroupError, RecoveryError, first_line
from ..waits import SAY_AFTER_S
from .fanout import FANOUT, ReplyKind, classify
from .slots import Slot
from .timing import CONTROL_CALL_S, STEP_CHECK_S, STEP_GRACE_S

logger = logging.getLogger(__name__)

_STEP_WORDS = {"_setup": "form the process group", "_join": "re-form the process group"}


#: Words of an error a rank meets because a peer left the step (its connection refused, closed or reset): what the
#: peer met first is the cause to name.
_LOST_PEER = re.compile(r"Connection (refused|closed|reset)|closed by peer|Broken pipe|Failed to recv|"
                        r"timed out connecting|Socket Timeout", re.IGNORECASE)


def _raise_for(exc: BaseException, rank: int, slot: Slot, what: str, also: str = "") -> None:
    kind, error = classify(exc, rank, slot)
    if kind is ReplyKind.DIED:
        raise error
    if isinstance(error, GroupError):
        raise type(error)(first_line(error) + also) from None
    raise GroupError(f"the workers could not {what}: rank {rank}: {type(error).__name__}: {first_line(error)}"
                     f"{also}") from None


def _raise_first_cause(slots: Sequence[Slot], refs: List[Any], rank: int, exc: BaseException, what: str) -> None:
    """A rank failed the step (its peers were released): raise what names the cause. The released ranks answer
    at once; within :data:`CONTROL_CALL_S` their errors are read too, and the one named is a death, else the first
    error that is not a lost connection to a peer (a rank whose peer left the step meets "Connection refused" or
    "closed by peer": the peer's own error is the cause), else the first; the others are counted after it."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    failed = [(rank, exc)]
    rest = [ref for i, ref in enumerate(refs) if i != rank]
    if rest:
        ready, _ = ray.wait(rest, num_returns=len(rest), timeout=CONTROL_CALL_S)
        for ref in ready:
            try:
                ray.get(ref, timeout=0)
            except Exception as other:  # noqa: BLE001 - each rank's own error, sorted below
                failed.append((refs.index(ref), other))
    pick, also = first_cause([(r, *classify(e, r, slots[r])) for r, e in failed])
    _raise_for(failed[pick][1], failed[pick][0], slots[failed[pick][0]], what, also)


def first_cause(failed: Sequence[Any]) -> Any:
    """Of ``failed`` (``(rank, ReplyKind, error)`` in the order met), the index of the one to name and what to say of
    the others: a death first, else the first error that is not a lost connection to a peer, else the first."""
    dead = [i for i, (_, kind, _) in enumerate(failed) if kind is ReplyKind.DIED]
    causes = [i for i, (_, kind, err) in enumerate(failed) if kind is not ReplyKind.DIED and not _LOST_PEER.search(
        str(err))]
    pick = (dead or causes or [0])[0]
    others = sorted(r for i, (r, _, _) in enumerate(failed) if i != pick)
    if not others:
        return pick, ""
    return pick, (f" (rank(s) {', '.join(map(str, others))} failed too, "
                  f"{'after it' if dead or causes else 'each losing a peer'})")


def _activities(slots: Sequence[Slot], ranks: Sequence[int]) -> Dict[int, Any]:
    """What each rank's cell thread does now; a rank that does not answer in time is left out."""
    return FANOUT.ask([slots[r] for r in ranks], lambda s: s.actor.activity.remote(), CONTROL_CALL_S,
                      "the ranks to say what they do", ranks=list(ranks)).values()


def release_ranks(slots: Sequence[Slot]) -> None:
    """Break every rank's process group so ranks blocked in the step return."""
    FANOUT.ask(list(slots), lambda s: s.actor.release.remote(), CONTROL_CALL_S,
               "every rank to break its process group")


def await_settled(slots: Sequence[Slot], deadline_s: float) -> None:
    """Before a new formation: wait until no rank is still in an earlier, failed one (a rank whose peer died
    while it connected gives up within the worker's formation timeout). Ranks still in it are released at every
    check, so each gives up at once where it can: a rank that reached the rendezvous after one release (it was
    still leaving its old group, or not yet connected) would otherwise wait there for the whole formation
    timeout, once for each of its waits.

    Raises:
        GroupError: a rank is still in the earlier formation after ``deadline_s``, naming it.
    """
    start = time.monotonic()
    while True:
        busy = [r for r, act in _activities(slots, range(len(slots))).items() if act.get("call") in _STEP_WORDS]
        if not busy:
            return
        release_ranks([slots[r] for r in busy])
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
    preparing: Set[int] = set()  # ranks not in the step yet because their worker is still starting (imports)
    last_answer = {r: start for r in range(len(slots))}
    said = False
    while pending:
        ready, pending = ray.wait(pending, num_returns=len(pending), timeout=STEP_CHECK_S)
        for ref in ready:
            try:
                ray.get(ref, timeout=CONTROL_CALL_S)
            except Exception as exc:  # noqa: BLE001 - a rank failed: the step cannot end
                if pending:
                    release_ranks(slots)
                _raise_first_cause(slots, refs, refs.index(ref), exc, what)
        if not pending:
            break
        now = time.monotonic()
        if ready and first_done is None:
            first_done = now
        waiting = [i for i, ref in enumerate(refs) if ref in pending]
        if now - start >= STEP_GRACE_S:
            problem = _check(slots, waiting, step, now, first_done, odd, last_answer, silent_s, start, preparing)
            if problem:
                release_ranks(slots)
                raise RecoveryError(f"could not {what}: {problem}; the group's process group was broken so "
                                    "no rank waits: run the command again (%dist_restart or %dist_rescale)")
        if now - start > deadline_s:
            release_ranks(slots)
            late = sorted(preparing & set(waiting))
            if late:
                raise GroupError(f"the workers did not {what} within {deadline_s:g} s: rank(s) "
                                 f"{', '.join(map(str, late))} still starting (importing torch and the modules a "
                                 "worker begins with; the machine may be busy): raise start_timeout_s, or check "
                                 "the load and `ray status`")
            raise GroupError(f"the workers did not {what} within {deadline_s:g} s (rank(s) "
                             f"{', '.join(map(str, waiting))} still in it); raise start_timeout_s or check `ray status`")
        if not said and now - start > SAY_AFTER_S:
            said = True
            logger.info("waiting for rank(s) %s to %s (%.0f s so far, deadline %g s)",
                        ", ".join(map(str, waiting)), what, now - start, deadline_s)
    return ray.get(refs, timeout=CONTROL_CALL_S)


def _check(slots: Sequence[Slot], waiting: List[int], step: str, now: float, first_done: Any,
           odd: Dict[int, float], last_answer: Dict[int, float], silent_s: float, started: float,
           preparing: Set[int]) -> str:
    """What is wrong with the ranks still in the step, or "". A rank still starting its worker (importing
    torch on a busy machine, its step queued behind that) is on its way, not out of step: it is noted in
    ``preparing`` and waited for under the step's deadline."""
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
        if act.get("preparing"):
            preparing.add(rank)
            odd.pop(rank, None)
            continue
        preparing.discard(rank)
        if act.get("call") == step:
            odd.pop(rank, None)
            continue
        since = odd.setdefault(rank, now)
        if now - since >= STEP_GRACE_S:
            doing = f"running {act['call']}" if act.get("call") else "idle"
            return f"rank {rank} is {doing}, not in the step, while its peers wait in it (a protocol error)"
    return ""
