"""The one way the driver asks every rank (or a chosen set) for something under one deadline.

Status pings, interrupts, pulls, releases, the activity checks of a collective step and the calls of
forming and recovery all go through :meth:`Fanout.ask`: every call is submitted at once, one deadline
covers them all (a stopped rank costs one deadline, not one per rank), and each rank comes back as a
typed :class:`Reply`: ``ok`` (its value), ``raised`` (the exception the call raised, unwrapped from
Ray's task error), ``died`` (a :class:`~raytrain_nb.WorkerDiedError` with Ray's cause), ``unresponsive``
(the group already knew it stopped answering) or ``late`` (no answer by the deadline). Callers decide
what each kind means for them; :meth:`Replies.check` turns anything but ``ok`` into one error.

Ray's task and actor errors are unwrapped here and nowhere else (:func:`classify`).

The waits that are not "ask every rank" keep their own place: the wait on the user's cell
(``dispatch.py``), the step watch of a collective (``steps.py``), the monitor's zero-timeout polls
(``monitor.py``) and placement groups (``placement.py``).
"""
from __future__ import annotations

import dataclasses
import enum
import logging
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Type

from ..errors import GroupError, WorkerDiedError, WorkerLostError, WorkerUnresponsiveError, first_line
from ..waits import FETCH_S, wait_until, wait_within
from .monitor import death_cause
from .slots import Slot
from .state import SlotState

logger = logging.getLogger(__name__)


class ReplyKind(str, enum.Enum):
    """How one rank answered a fanned-out call."""

    OK = "ok"
    RAISED = "raised"
    DIED = "died"
    UNRESPONSIVE = "unresponsive"
    LATE = "late"


@dataclasses.dataclass(frozen=True)
class Reply:
    """One rank's answer: its ``value`` when ``ok``, else the ``error`` (None when ``late``)."""

    rank: int
    kind: ReplyKind
    value: Any = None
    error: Optional[BaseException] = None

    @property
    def ok(self) -> bool:
        return self.kind is ReplyKind.OK

    @property
    def lost(self) -> bool:
        """The worker is gone (died) or known not to answer."""
        return self.kind in (ReplyKind.DIED, ReplyKind.UNRESPONSIVE)


def death_of(rank: int, slot: Optional[Slot], cause: str, unresponsive: bool = False) -> WorkerLostError:
    """The typed death of ``rank``'s worker, naming its pid and node."""
    info = slot.info if slot is not None else {}
    kind = WorkerUnresponsiveError if unresponsive else WorkerDiedError
    return kind(rank, cause, pid=info.get("pid"), node=str(info.get("node_ip", "") or ""))


def classify(exc: BaseException, rank: int, slot: Optional[Slot]) -> Tuple[ReplyKind, BaseException]:
    """What an exception from ``ray.get`` of a rank's call means: the rank died (Ray's cause named), or the
    call raised (the remote exception itself, unwrapped from Ray's task error; also where it is another actor's
    death, met by the rank fetching that actor's result: the rank itself lives)."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    if isinstance(exc, ray.exceptions.RayTaskError):  # first: a call that raised another actor's death is a raise
        cause = getattr(exc, "cause", None)
        return ReplyKind.RAISED, cause if cause is not None else exc
    if isinstance(exc, ray.exceptions.RayActorError):
        return ReplyKind.DIED, death_of(rank, slot, death_cause(exc))
    if isinstance(exc, ray.exceptions.GetTimeoutError):
        return ReplyKind.LATE, exc
    return ReplyKind.RAISED, exc


class Replies:
    """Every asked rank's :class:`Reply`, in the order asked."""

    def __init__(self, replies: Sequence[Reply], what: str, deadline_s: float) -> None:
        self.replies = list(replies)
        self.what = what
        self.deadline_s = deadline_s

    def __iter__(self) -> Iterator[Reply]:
        return iter(self.replies)

    def __len__(self) -> int:
        return len(self.replies)

    def __getitem__(self, i: int) -> Reply:
        return self.replies[i]

    def of(self, *kinds: ReplyKind) -> List[Reply]:
        return [r for r in self.replies if r.kind in kinds]

    def ranks(self, *kinds: ReplyKind) -> List[int]:
        return [r.rank for r in self.of(*kinds)]

    def values(self) -> Dict[int, Any]:
        """rank -> value, of the ranks that answered."""
        return {r.rank: r.value for r in self.replies if r.ok}

    @property
    def all_ok(self) -> bool:
        return all(r.ok for r in self.replies)

    def check(self, *, error: Type[Exception] = GroupError, hint: str = "check `ray status` and the workers' logs",
              ) -> List[Any]:
        """Every value in the order asked, or one error for the first kind of trouble: a death (raised as the
        :class:`WorkerDiedError` / :class:`WorkerUnresponsiveError` itself), a call that raised (a
        ``GroupError`` as itself, anything else as ``error`` naming its type), or ranks that did not answer
        by the deadline (``error`` naming them and ``hint``)."""
        lost = self.of(ReplyKind.DIED, ReplyKind.UNRESPONSIVE)
        if lost:
            raise lost[0].error  # type: ignore[misc]
        raised = self.of(ReplyKind.RAISED)
        if raised:
            cause = raised[0].error
            if isinstance(cause, GroupError):
                raise type(cause)(first_line(cause)) from None
            raise error(f"rank {raised[0].rank} raised {type(cause).__name__}: {first_line(cause)} (while waiting "
                        f"for {self.what})") from None
        late = self.ranks(ReplyKind.LATE)
        if late:
            raise error(f"gave up waiting for {self.what} after {self.deadline_s:g} s (no answer from rank(s) "
                        f"{', '.join(map(str, late))}): {hint}")
        return [r.value for r in self.replies]


def collect(refs: Sequence[Any], deadline_s: float, what: str, slots: Any = (), *,
            hint: str = "check `ray status` and the workers' logs",
            on_death: Optional[Callable[[List[int]], None]] = None) -> List[Any]:
    """The answers to calls already submitted (``refs``: one per rank, in rank order), under one deadline, typed
    as :meth:`Fanout.ask` types them and checked as :meth:`Replies.check` does. ``slots`` names the workers
    in a death (a ref past their number, or any when the calls went to workers not yet given a rank, is
    named by its position only). ``on_death``: called once, with the positions still unanswered, as soon as one
    call's worker died (a collective step: the others are released rather than left waiting for the dead peer
    until the deadline)."""
    refs = list(refs)
    known = list(slots) if len(slots) == len(refs) else []
    answers: Dict[Any, Tuple[bool, Any]] = {}  # ref -> (ok, value or exception): each answer fetched once
    if on_death is None:
        ready, _ = wait_within(refs, deadline_s, what, logger)
        answers.update(fetch_all(ready))
    else:
        ready = _wait_releasing(refs, deadline_s, what, on_death, answers)
    done = set(ready)
    replies = []
    for i, ref in enumerate(refs):
        if ref not in done:
            replies.append(Reply(i, ReplyKind.LATE))
            continue
        ok, value = answers[ref]
        if ok:
            replies.append(Reply(i, ReplyKind.OK, value))
        else:
            kind, err = classify(value, i, known[i] if known else None)
            replies.append(Reply(i, kind, error=err))
    return Replies(replies, what, deadline_s).check(hint=hint)


def fetch_all(ready: Sequence[Any]) -> Dict[Any, Tuple[bool, Any]]:
    """Ready calls' answers, ref -> ``(True, value)`` or ``(False, the exception)`` to be typed: in one fetch
    while none of them failed (one call, not one per rank), else ref by ref."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    ready = list(ready)
    if not ready:
        return {}
    try:
        return {ref: (True, value) for ref, value in zip(ready, ray.get(ready, timeout=FETCH_S))}  # ready: a fetch
    except Exception:  # noqa: BLE001 - which one failed, and how, is sorted out ref by ref
        pass
    out: Dict[Any, Tuple[bool, Any]] = {}
    for ref in ready:
        try:
            out[ref] = (True, ray.get(ref, timeout=FETCH_S))
        except Exception as exc:  # noqa: BLE001 - typed by the caller
            out[ref] = (False, exc)
    return out


def _wait_releasing(refs: List[Any], deadline_s: float, what: str, on_death: Callable[[List[int]], None],
                    answers: Dict[Any, Tuple[bool, Any]]) -> List[Any]:
    """:func:`wait_within` that calls ``on_death`` (once, with the positions still pending) when a worker died;
    each answer is fetched as it comes, into ``answers``."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    pending = list(dict.fromkeys(refs))
    released = False

    def step(slice_s: float) -> bool:
        nonlocal pending, released
        end = time.monotonic() + slice_s
        while pending:
            done, pending = ray.wait(pending, num_returns=1, timeout=max(0.0, end - time.monotonic()))
            if not done:
                return False
            if pending:  # and every other answer already in: fetched together
                more, pending = ray.wait(pending, num_returns=len(pending), timeout=0)
                done += more
            fetched = fetch_all(done)
            answers.update(fetched)
            died = any(not ok and classify(value, 0, None)[0] is ReplyKind.DIED for ok, value in fetched.values())
            if not released and pending and died:
                released = True
                waiting = set(pending)
                on_death([i for i, ref in enumerate(refs) if ref in waiting])
        return True

    wait_until(step, deadline_s, what, logger)
    late = set(pending)
    return [r for r in refs if r not in late]


class Fanout:
    """Asks a set of ranks one call each, all at once, under one deadline (see the module docstring)."""

    def __init__(self, log: logging.Logger = logger) -> None:
        self.log = log

    def ask(self, slots: Sequence[Slot], call: Callable[[Slot], Any], deadline_s: float, what: str,
            ranks: Optional[Sequence[int]] = None) -> Replies:
        """Submit ``call(slot)`` (an actor method's ``.remote(...)``) to every slot, then wait for all of them.

        Args:
            slots: whom to ask (ranks, spares, or workers not yet given a rank).
            call: submits one call and returns its object ref.
            deadline_s: one deadline for all of them (a constant of ``timing.py``).
            what: what is awaited, as a noun phrase after "waiting for" ("every rank to answer a ping").
            ranks: the label of each slot (default: its position).

        Returns:
            One :class:`Reply` per slot, in order. A slot already marked dead or unresponsive is not asked:
            it comes back ``died`` / ``unresponsive`` at once.
        """
        labels = list(ranks) if ranks is not None else list(range(len(slots)))
        out: List[Optional[Reply]] = [None] * len(slots)
        refs: Dict[Any, int] = {}
        for i, slot in enumerate(slots):
            if slot.gone:
                dead = slot.state == SlotState.DEAD
                out[i] = Reply(labels[i], ReplyKind.DIED if dead else ReplyKind.UNRESPONSIVE,
                               error=death_of(labels[i], slot, slot.error or "already gone", unresponsive=not dead))
                continue
            try:
                refs[call(slot)] = i
            except Exception as exc:  # noqa: BLE001 - a handle that cannot take calls: its worker is gone
                kind, err = classify(exc, labels[i], slot)
                out[i] = Reply(labels[i], kind, error=err)
        if refs:
            ready, _ = wait_within(list(refs), deadline_s, what, self.log)
            fetched = fetch_all(ready)
            for ref, i in refs.items():
                if ref not in fetched:
                    out[i] = Reply(labels[i], ReplyKind.LATE)
                    continue
                ok, value = fetched[ref]
                if ok:
                    out[i] = Reply(labels[i], ReplyKind.OK, value)
                else:
                    kind, err = classify(value, labels[i], slots[i])
                    out[i] = Reply(labels[i], kind, error=err)
        return Replies([r for r in out if r is not None], what, deadline_s)


#: The group's fan-out (stateless: one is enough for every group).
FANOUT = Fanout()
