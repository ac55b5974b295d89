"""``barrier()`` and ``broadcast_from_rank_zero()`` (Ray Train's ``ray.train.collective``) on a group's ranks.

They need no process group, so they work on every backend (``none``, XGBoost, LightGBM and TensorFlow included):
rank 0's worker keeps the book (:mod:`.rendezvous`). A rank calls rank 0's worker on its control channel to say it
arrived (introducing its own worker the first time), then waits; rank 0's worker tells each waiting rank the
outcome once the last one arrived (the last one learns it from its own call), with rank 0's data for a broadcast.

The driver sends each cell or function call a :class:`CollectiveSpec`: the round (one per call, so nothing of an
interrupted cell, a restart or a rescale is met again), the world size, the deadline, and rank 0's worker when it
is new to the rank. A waiting rank never hangs: past the deadline it fails naming the ranks that did not arrive;
Ctrl-C, the driver's release after a peer died, and a peer that stopped waiting end its wait at once (a rank that
leaves with an error tells rank 0, which tells the others); a peer whose call ended (it returned, or raised before
arriving) is named within a poll of the driver, which sees the waiting rank and tells rank 0. Outside a call from the driver (a new rank replaying
cells alone, a one-rank group, local mode) there is nobody to wait for: ``barrier()`` returns at once and
``broadcast_from_rank_zero(x)`` returns ``x``.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
import time
from typing import Any, Dict, List, Optional, Tuple, TypeVar

from .. import settings
from ..errors import CollectiveError, CollectiveReleasedError, CollectiveTimeoutError, first_line, format_ranks
from .rendezvous import BARRIER, BROADCAST, Key, Notice, Outcome, Rendezvous
from .session import current_session

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: How long a waiting rank blocks at a time: Ctrl-C (an exception raised in the thread) lands between two waits.
SLICE_S = 0.1
#: Rank 0 logs which ranks it still waits for this often (as Ray Train does).
WARN_EVERY_S = 60.0
#: Deadline of one call to rank 0's worker that it answers at once (which ranks are missing).
ASK_S = 5.0
#: Ray Train warns about a broadcast above this many pickled bytes (its documented limit for "small data").
LARGE_BROADCAST_BYTES = 1000


@dataclasses.dataclass(frozen=True)
class CollectiveSpec:
    """What a rank needs for the collectives of one cell or function call (built by the driver for each rank).

    Attributes:
        round: numbers the driver's calls to the group; a collective is ``(round, its count in the call)``.
        world_size: the ranks that must arrive.
        timeout_s: how long a rank waits for the others.
        token: which worker is rank 0 (changes when rank 0's worker does).
        coordinator: rank 0's actor handle, sent only to a worker that lacks the current one.
    """

    round: int
    world_size: int
    timeout_s: float
    token: int
    coordinator: Any = None

    def to_wire(self) -> List[Any]:
        """The fields as a list: a cell's request carries it so, and Ray sends it without pickling it."""
        return [self.round, self.world_size, self.timeout_s, self.token, self.coordinator]

    @classmethod
    def from_wire(cls, data: Optional[List[Any]]) -> Optional["CollectiveSpec"]:
        """The spec :meth:`to_wire` sent (None: a rank alone)."""
        return None if data is None else cls(*data)


class _RankState:
    """This process's side: the current call's spec, its collective count, and the outcomes rank 0 sent."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.spec: Optional[CollectiveSpec] = None
        self.partial = False
        self.released = False
        self.seq = 0
        self.delivered: Dict[Key, Outcome] = {}
        self.coordinator: Tuple[int, Any] = (0, None)
        self.introduced: Tuple[int, int] = (0, -1)  # (token, rank) rank 0's worker knows this worker as
        self.warned_large = 0  # the round whose broadcast was last warned about
        self.me: Any = None
        self.waiting: Optional[Key] = None  # the collective this rank waits at now (the driver's poll reads it)

    def begin(self, spec: Optional[CollectiveSpec], partial: bool) -> None:
        with self.cond:
            self.spec, self.partial, self.released, self.seq = spec, partial, False, 0
            self.delivered.clear()
            if spec is not None and spec.coordinator is not None:
                self.coordinator = (spec.token, spec.coordinator)

    def next_key(self, spec: CollectiveSpec) -> Key:
        with self.cond:
            self.seq += 1
            return (spec.round, self.seq)

    def deliver(self, key: Key, outcome: Outcome) -> None:
        with self.cond:
            if self.spec is not None and key[0] == self.spec.round:
                self.delivered[key] = outcome
                self.cond.notify_all()

    def release(self) -> bool:
        with self.cond:
            if self.spec is None:
                return False
            self.released = True
            self.cond.notify_all()
            return True

    def take(self, op: str, key: Key, timeout: float) -> Optional[Outcome]:
        """The outcome told for ``key``, waiting up to ``timeout``; None if none yet.

        Raises:
            CollectiveReleasedError: the driver released this rank (a peer failed).
        """
        with self.cond:
            if key not in self.delivered and not self.released:
                self.cond.wait(timeout)
            if key in self.delivered:
                return self.delivered.pop(key)
            if self.released:
                raise CollectiveReleasedError(f"{op}(): released while waiting: a peer failed or the call was stopped")
            return None


_STATE = _RankState()
#: Rank 0's book (used in rank 0's process only).
RENDEZVOUS = Rendezvous()


def begin(spec: Optional[CollectiveSpec], partial: bool) -> None:
    """On a worker, before a cell or function call: its collectives are those of ``spec`` (None: a rank alone)."""
    _STATE.begin(spec, partial)


def release_waiting() -> bool:
    """On a worker's control thread: end the wait of a rank in a collective now (the driver's release after a peer
    failed); the call's later collectives fail at once. Returns whether a call was running."""
    return _STATE.release()


# -- rank 0's worker: arrivals, departures and the outcomes it sends ----------------------------------------


def _send(notices: List[Notice]) -> None:
    """Tell each rank its outcome: rank 0 (this process) directly, the others through their workers."""
    for rank, key, outcome in notices:
        if rank == 0:
            _STATE.deliver(key, outcome)
            continue
        try:
            RENDEZVOUS.peer(rank).collective_release.remote(key, outcome)
        except Exception as exc:  # noqa: BLE001 - a rank that died meanwhile: its own death ends the call
            logger.debug("telling rank %d the outcome of %s failed: %s", rank, key, exc)


def arrived(key: Key, world_size: int, rank: int, op: str, payload: Any, handle: Any) -> Optional[Outcome]:
    """On rank 0's worker: ``rank`` arrived at ``key``; returns its outcome when known now (None: it waits)."""
    outcome, notices = RENDEZVOUS.arrive(key, world_size, rank, op, payload, handle)
    _send(notices)
    return outcome


def abandoned(key: Key, rank: int, why: str) -> None:
    """On rank 0's worker: ``rank`` left ``key`` with an error; the ranks waiting there are released."""
    _send(RENDEZVOUS.abandon(key, rank, why))


class CollectiveWorker:
    """The calls of the group's collectives a worker answers on its control channel (a part of ``Worker``)."""

    def collective_arrive(self, key: Key, world_size: int, rank: int, op: str,
                          handle: Any = None) -> Optional[Outcome]:
        """On rank 0: a rank arrived at a collective (see :func:`arrived`)."""
        return arrived(tuple(key), world_size, rank, op, None, handle)

    def collective_leave(self, key: Key, rank: int, why: str) -> None:
        """On rank 0: a rank left a collective with an error (see :func:`abandoned`)."""
        abandoned(tuple(key), rank, why)

    def collective_missing(self, key: Key, world_size: int) -> List[int]:
        """On rank 0: the ranks that have not arrived at a collective."""
        return RENDEZVOUS.missing(tuple(key), world_size)

    def collective_finished(self, round_: int, ranks: Dict[int, bool]) -> None:
        """On rank 0: the driver saw the call end on ``ranks`` (rank -> failed) while others wait in a collective."""
        _send(RENDEZVOUS.finished(round_, ranks))

    def collective_release(self, key: Key, outcome: Outcome) -> None:
        """On any rank: rank 0 tells this rank how the collective it waits at ended."""
        _STATE.deliver(tuple(key), tuple(outcome))


#: The methods above: the worker answers them on its control channel, while user code runs.
CONTROL_METHODS = ("collective_arrive", "collective_leave", "collective_missing", "collective_finished",
                   "collective_release")


def waiting_at() -> Optional[Key]:
    """The collective this rank waits at now, or None (the driver's poll reads it)."""
    return _STATE.waiting


# -- the calls user code makes --------------------------------------------------------------------------------


def barrier() -> None:
    """Wait until every rank of the group (or of the trainer) called ``barrier()``.

    Example:
        >>> if get_context().get_world_rank() == 0:   # doctest: +SKIP
        ...     download(data_dir)
        >>> collective.barrier()                      # the other ranks wait here for rank 0
    """
    _collective(BARRIER, None)


def broadcast_from_rank_zero(data: T) -> T:
    """Return rank 0's ``data`` on every rank; every rank must call it (it is a barrier too).

    ``data`` must pickle; as in Ray Train it is meant for small values (a warning above 1000 bytes pickled).

    Example:
        >>> split = make_split() if get_context().get_world_rank() == 0 else None   # doctest: +SKIP
        >>> split = collective.broadcast_from_rank_zero(split)                      # rank 0's split everywhere
    """
    return _collective(BROADCAST, data)


def _collective(op: str, data: Any) -> Any:
    sess = current_session()
    if sess is None:
        raise RuntimeError(f"raytrain_nb.collective.{op}() works only on a worker: call it inside a %%distributed "
                           "cell, a WorkerGroup.run/execute, or a trainer's train_loop_per_worker")
    spec = _STATE.spec
    if spec is None or spec.world_size <= 1:  # a rank alone: a replay, a one-rank group, local mode
        return data
    if _STATE.partial:
        raise CollectiveError(f"{op}() needs every rank of the group, and this call runs on some ranks only "
                              "(--ranks): run it on every rank")
    rank = sess.context.world_rank
    key = _STATE.next_key(spec)
    payload = _dumps(data, spec.round) if op == BROADCAST and rank == 0 else None
    kind, value = _wait(op, key, spec, rank, payload)
    if kind == "ok":
        return data if rank == 0 or op == BARRIER else _loads(value)
    if kind == "error":
        raise CollectiveError(f"{op}(): {value}")
    raise CollectiveReleasedError(f"{op}(): {value}")


def _dumps(data: Any, round_: int) -> bytes:
    """Rank 0's data pickled once, here: a value that does not pickle fails in the caller, as in Ray Train."""
    from ray import cloudpickle  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    payload = cloudpickle.dumps(data)
    if len(payload) > LARGE_BROADCAST_BYTES and _STATE.warned_large != round_:
        _STATE.warned_large = round_  # once a call: not on every step of a loop
        logger.warning("broadcast_from_rank_zero(): %d bytes pickled, above the %d bytes Ray Train means it for",
                       len(payload), LARGE_BROADCAST_BYTES)
    return payload


def _loads(payload: bytes) -> Any:
    from ray import cloudpickle  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    return cloudpickle.loads(payload)


def _why(exc: BaseException) -> str:
    """Why a rank left a collective with an error, as its peers are told."""
    if isinstance(exc, KeyboardInterrupt):
        return "interrupted"
    if isinstance(exc, CollectiveTimeoutError):
        return "its deadline passed"
    if isinstance(exc, CollectiveReleasedError):
        return "released after a peer failed"
    return f"{type(exc).__name__}: {first_line(exc)}"


def _wait(op: str, key: Key, spec: CollectiveSpec, rank: int, payload: Any) -> Outcome:
    """Arrive at ``key`` and wait for its outcome; a rank that leaves with an error (deadline, Ctrl-C, released)
    tells rank 0, which releases the ranks waiting there."""
    coordinator = None
    _STATE.waiting = key
    try:
        if rank == 0:
            outcome = arrived(key, spec.world_size, 0, op, payload, None)
            return outcome if outcome is not None else _await(op, key, spec, rank, None, None)
        coordinator = _coordinator(op, spec)
        ref = coordinator.collective_arrive.remote(key, spec.world_size, rank, op, _introduction(spec, rank))
        return _await(op, key, spec, rank, ref, coordinator)
    except BaseException as exc:
        _leave(key, rank, coordinator, _why(exc))
        raise
    finally:
        _STATE.waiting = None


def _await(op: str, key: Key, spec: CollectiveSpec, rank: int, ref: Any, coordinator: Any) -> Outcome:
    """Wait, in slices, for ``key``'s outcome: first the answer to this rank's arrival (``ref``), then rank 0's
    notice; past ``spec.timeout_s``, fail naming the ranks that did not arrive."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    started = time.monotonic()
    deadline, warn_at, extended = started + spec.timeout_s, started + WARN_EVERY_S, False
    while True:
        now = time.monotonic()
        if now >= deadline:
            missing = _missing(key, spec, rank, coordinator)
            if missing == [] and not extended:  # every rank arrived just now: the notice is on its way
                deadline, extended = now + ASK_S, True
                continue
            raise _timeout(op, spec, missing)
        if rank == 0 and now >= warn_at:
            warn_at += WARN_EVERY_S
            logger.warning("%s(): rank 0 has waited %.0f s for %s (the deadline is %g s)", op, now - started,
                           format_ranks(RENDEZVOUS.missing(key, spec.world_size)), spec.timeout_s)
        step = min(SLICE_S, deadline - now)
        if ref is None:
            outcome = _STATE.take(op, key, step)
        else:
            outcome = _STATE.take(op, key, 0)
            if outcome is None and ray.wait([ref], timeout=step)[0]:
                try:
                    outcome = ray.get(ref, timeout=ASK_S)  # ready: only fetched
                except Exception as exc:  # noqa: BLE001 - rank 0's worker died or failed to take the arrival
                    raise CollectiveReleasedError(f"{op}(): rank 0's worker, which keeps the group's collectives, "
                                                  f"did not take this rank's arrival: {first_line(exc)}") from None
                ref = None
        if outcome is not None:
            return tuple(outcome)


def _missing(key: Key, spec: CollectiveSpec, rank: int, coordinator: Any) -> Optional[List[int]]:
    """The ranks that have not arrived at ``key`` (rank 0's book), or None when rank 0's worker does not answer."""
    if rank == 0:
        return RENDEZVOUS.missing(key, spec.world_size)
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    try:
        return list(ray.get(coordinator.collective_missing.remote(key, spec.world_size), timeout=ASK_S))
    except Exception as exc:  # noqa: BLE001 - said in the error instead
        logger.debug("asking rank 0 which ranks are missing failed: %s", exc)
        return None


def _timeout(op: str, spec: CollectiveSpec, missing: Optional[List[int]]) -> CollectiveTimeoutError:
    knob = f"{settings.COLLECTIVE_TIMEOUT_S.name} sets this deadline"
    if missing is None:
        return CollectiveTimeoutError(f"{op}(): not every rank arrived within {spec.timeout_s:g} s, and rank 0's "
                                      f"worker did not say which ({knob})", (), spec.timeout_s)
    return CollectiveTimeoutError(f"{op}(): {format_ranks(missing)} did not arrive within {spec.timeout_s:g} s "
                                  f"({knob})", missing, spec.timeout_s)


def _leave(key: Key, rank: int, coordinator: Any, why: str) -> None:
    """Tell rank 0 that this rank left ``key`` with an error (best effort: rank 0 may be the one that failed)."""
    if rank == 0:
        abandoned(key, 0, why)
        return
    if coordinator is None:
        return
    try:
        coordinator.collective_leave.remote(key, rank, why)
    except Exception as exc:  # noqa: BLE001 - rank 0's worker is gone: nobody waits for this notice
        logger.debug("telling rank 0 that rank %d left %s failed: %s", rank, key, exc)


def _coordinator(op: str, spec: CollectiveSpec) -> Any:
    """Rank 0's worker, as the driver gave it to this one."""
    token, handle = _STATE.coordinator
    if token != spec.token or handle is None:
        raise CollectiveError(f"{op}(): this rank was not told which worker is rank 0: run the cell again")
    return handle


def _introduction(spec: CollectiveSpec, rank: int) -> Any:
    """This worker's own handle when rank 0's worker does not know it at this rank yet, else None."""
    if _STATE.introduced == (spec.token, rank):
        return None
    if _STATE.me is None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        _STATE.me = ray.get_runtime_context().current_actor
    _STATE.introduced = (spec.token, rank)
    return _STATE.me
