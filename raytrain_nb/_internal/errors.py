"""One picklable exception hierarchy for everything the group reports.

Errors raised on workers travel to the driver as :class:`RankFailure` records;
the driver merges identical ones (``[rank 0, 1]: ...``) into one
:class:`WorkerError` whose traceback renders as the user's cell, not as our
stack (IPython calls ``_render_traceback_``).
"""
from __future__ import annotations

import dataclasses
import pickle
import threading
from typing import Any, Dict, List, Optional, Sequence, Tuple

#: Error-message fragments of a collective that failed because a peer went away.
_COLLECTIVE_MARKERS = (
    "connection reset by peer",
    "connection closed by peer",
    "broken pipe",
    "socket closed",
    "connection refused",
    "gloo/transport",
    "ncclremoteerror",
    "nccl communicator was aborted",
    "process group was aborted",
)

_MAX_TRACEBACK_LINES = 60


class RaytrainNbError(Exception):
    """Base class of every error raised by raytrain_nb."""


class GroupError(RaytrainNbError):
    """The worker group cannot do what was asked (wrong state, bad argument)."""


class TransitionError(GroupError):
    """A group was asked to change state in a way its state machine does not allow (a bug)."""


class RecoveryError(GroupError):
    """A restart or rescale cannot give a new rank what its peers hold (an object that cannot be
    copied), or the ranks did not take one step of re-forming together."""


class ResourceError(GroupError):
    """The cluster cannot place what was asked."""


class WorkerLostError(GroupError):
    """A rank's worker is lost: its process died (:class:`WorkerDiedError`) or it stopped answering
    (:class:`WorkerUnresponsiveError`). Catch this class for either.

    Attributes:
        rank: the world rank (or the position asked, for a worker not yet given one).
        cause: Ray's account of the death, or how long it has been silent.
        pid: the worker's process id, when known.
        node: the worker's node IP, when known.
    """

    verb = "is lost"

    def __init__(self, rank: int, cause: str, pid: Optional[int] = None, node: str = "") -> None:
        self.rank, self.cause, self.pid, self.node = rank, cause, pid, node
        where = ", ".join(part for part in (f"pid {pid}" if pid is not None else "",
                                             f"node {node}" if node else "") if part) or "not started yet"
        super().__init__(f"the worker process of rank {rank} ({where}) {self.verb}: {cause}")

    def __reduce__(self):
        return (type(self), (self.rank, self.cause, self.pid, self.node))


class WorkerDiedError(WorkerLostError):
    """A rank's worker process died (killed, out of memory, its node lost)."""

    verb = "died"


class WorkerUnresponsiveError(WorkerLostError):
    """A rank's worker stopped answering (stopped, or blocked in C code holding the GIL)."""

    verb = "stopped responding"


#: Both kinds of a lost worker.
DEATHS = (WorkerDiedError, WorkerUnresponsiveError)


class InterruptTimeout(RaytrainNbError):
    """A rank did not stop after an interrupt."""


class CollectiveError(RaytrainNbError):
    """``collective.barrier()`` or ``broadcast_from_rank_zero()`` cannot complete (the ranks called different
    collectives, or the cell runs on some ranks only)."""


class CollectiveTimeoutError(CollectiveError, TimeoutError):
    """A collective's deadline passed before every rank arrived.

    Attributes:
        missing: the ranks that did not arrive.
        timeout_s: the deadline, in seconds.
    """

    def __init__(self, message: str, missing: Sequence[int] = (), timeout_s: float = 0.0) -> None:
        super().__init__(message)
        self.missing, self.timeout_s = list(missing), timeout_s

    def __reduce__(self):
        return (type(self), (self.args[0], self.missing, self.timeout_s))


class CollectiveReleasedError(CollectiveError):
    """This rank left a collective unfinished: a peer failed or stopped waiting, or the cell was stopped."""


class StorageError(RaytrainNbError):
    """A storage path cannot be used (unknown protocol, not writable, not shared)."""


class CheckpointError(StorageError):
    """A checkpoint or the run's checkpoint index is missing, unknown or damaged."""


class CheckpointUploadError(CheckpointError):
    """A ``report(checkpoint_upload_mode=ASYNC)`` upload failed in the background; raised into the training thread.

    Raised there as a class (Python's asynchronous exceptions take no arguments): built without one, it takes the
    message left for the thread it is raised in.
    """

    messages: Dict[int, str] = {}

    def __init__(self, *args: Any) -> None:
        if not args:
            args = (self.messages.pop(threading.get_ident(), "a background checkpoint upload failed"),)
        super().__init__(*args)


class RunInUseError(CheckpointError):
    """Another live writer (a group or a trainer) holds the run's lease."""


class ConfigError(RaytrainNbError, ValueError):
    """A trainer argument or config field has a bad value, or cannot be honoured here."""


class NotSupportedError(ConfigError, NotImplementedError):
    """Ray Train API that exists here by name but cannot be honoured: an argument set to what cannot be done, or a
    function, method or property used. The message names the feature and what to do instead."""


class SnapshotError(RaytrainNbError):
    """The namespace cannot be snapshot or rolled back as asked."""


@dataclasses.dataclass
class RankFailure:
    """What went wrong on one rank, in plain picklable fields.

    Attributes:
        rank: the world rank.
        type_name: the exception's class name (``"ValueError"``).
        message: ``str(exc)``.
        traceback: the formatted traceback, starting at the user's cell.
        collateral: True when the error is a collective that failed because a
            peer left (shown only if no rank has a primary error).
        node: the node id or IP of the worker, when known.
        lost: the rank's worker died or stopped answering: the typed death (built on the driver).
        pickled: the exception itself, pickled on the worker (empty when it did not survive a round trip).
    """

    rank: int
    type_name: str
    message: str
    traceback: str = ""
    collateral: bool = False
    node: str = ""
    lost: Optional[WorkerLostError] = None
    pickled: bytes = dataclasses.field(default=b"", repr=False, compare=False)

    @classmethod
    def of_lost(cls, error: WorkerLostError) -> "RankFailure":
        """The failure of a rank whose worker died or stopped answering."""
        name = type(error).__name__
        return cls(error.rank, name, str(error), f"{name}: {error}", node=error.node, lost=error)

    def key(self) -> Tuple[str, str, str]:
        return (self.type_name, self.message, self.traceback)

    def exception(self) -> BaseException:
        """The exception the rank raised, typed, with its traceback text as a note (Python 3.11+); a lost
        worker's :class:`WorkerLostError`; a :class:`WorkerError` of this record when it could not travel."""
        if self.lost is not None:
            return self.lost
        try:
            exc = pickle.loads(self.pickled) if self.pickled else None
        except Exception:  # noqa: BLE001 - a class the driver cannot import: the record stands in for it
            exc = None
        if not isinstance(exc, BaseException):
            return WorkerError([self])
        if self.traceback and hasattr(exc, "add_note"):
            exc.add_note(f"(raised on rank {self.rank}{f' on node {self.node}' if self.node else ''})\n"
                         + cut_lines(self.traceback))
        return exc


def is_collective_failure(type_name: str, message: str) -> bool:
    """Whether an error looks like a collective broken by a departed peer."""
    if type_name not in ("RuntimeError", "DistBackendError", "DistNetworkError", "DistError"):
        return False
    low = message.lower()
    return any(m in low for m in _COLLECTIVE_MARKERS)


def format_ranks(ranks: Sequence[int]) -> str:
    """``[0, 1, 2]`` -> ``"rank 0, 1, 2"``; a single rank -> ``"rank 3"``."""
    return "rank " + ", ".join(str(r) for r in sorted(ranks))


def cut_lines(text: str, limit: int = _MAX_TRACEBACK_LINES) -> str:
    lines = text.rstrip("\n").splitlines()
    if len(lines) <= limit:
        return "\n".join(lines)
    head = lines[: limit // 2]
    tail = lines[-limit // 2 :]
    return "\n".join(head + [f"... ({len(lines) - limit} lines cut; the worker log has all) ..."] + tail)


def merge_failures(failures: Sequence[RankFailure]) -> List[Tuple[List[int], RankFailure]]:
    """Group identical failures; keep primary errors over collateral ones.

    Returns a list of ``(ranks, failure)`` in order of the lowest rank.
    """
    primary = [f for f in failures if not f.collateral]
    shown = primary or list(failures)
    groups: Dict[Tuple[str, str, str], List[RankFailure]] = {}
    for f in sorted(shown, key=lambda f: f.rank):
        groups.setdefault(f.key(), []).append(f)
    return [([f.rank for f in fs], fs[0]) for fs in groups.values()]


class WorkerError(RaytrainNbError):
    """A cell or function raised on one or more ranks.

    Attributes:
        failures: one :class:`RankFailure` per rank that failed.
        released: ranks that were blocked in a collective and released.
    """

    def __init__(self, failures: Sequence[RankFailure], released: Sequence[int] = (), reformed: bool = True):
        self.failures = list(failures)
        self.released = sorted(released)
        self.reformed = reformed
        super().__init__(self._summary())

    def __reduce__(self):
        return (WorkerError, (self.failures, self.released, self.reformed))

    @property
    def ranks(self) -> List[int]:
        """Ranks whose own error is shown (collateral ones excluded)."""
        return sorted(r for ranks, _ in merge_failures(self.failures) for r in ranks)

    @property
    def deaths(self) -> List[WorkerLostError]:
        """The ranks whose worker died or stopped answering, as typed errors."""
        return [f.lost for f in self.failures if f.lost is not None]

    @property
    def exceptions(self) -> Dict[int, BaseException]:
        """Rank -> the exception it raised (:meth:`RankFailure.exception`), for the ranks whose error is shown."""
        shown = [f for f in self.failures if not f.collateral] or self.failures
        return {f.rank: f.exception() for f in sorted(shown, key=lambda f: f.rank)}

    @property
    def type_names(self) -> List[str]:
        return [f.type_name for _, f in merge_failures(self.failures)]

    def _summary(self) -> str:
        parts = []
        for ranks, f in merge_failures(self.failures):
            parts.append(f"[{format_ranks(ranks)}] {f.type_name}: {f.message}".rstrip(": "))
        return "; ".join(parts)

    def render(self) -> str:
        """The full text shown to the user: each merged traceback, labelled."""
        out = []
        for ranks, f in merge_failures(self.failures):
            header = f"[{format_ranks(ranks)}]"
            if f.node:
                header += f" on node {f.node}"
            body = cut_lines(f.traceback) if f.traceback else f"{f.type_name}: {f.message}"
            out.append(f"{header}\n{body}")
        if self.deaths:
            out.append("Recover with %dist_restart (replace the dead ranks; state copied from a live peer), "
                       "%dist_rescale N (continue with N workers), or %dist_rollback (load a snapshot); "
                       "in Python: group.restart(), group.rescale(n), group.rollback().")
        if self.released:
            out.append(
                f"({format_ranks(self.released)} released from a collective the failed rank(s) left"
                + ("; the process group was re-formed)" if self.reformed else ")")
            )
        return "\n\n".join(out)

    def _render_traceback_(self) -> List[str]:  # IPython hook: show the cell, not our stack
        return self.render().splitlines()

    def __str__(self) -> str:
        return self._summary()


def failure_from_exception(rank: int, exc: BaseException, traceback_text: str, node: str = "",
                           pickled: bytes = b"") -> RankFailure:
    """Build a :class:`RankFailure` from a live exception (``pickled``: the exception, pickled on the worker)."""
    type_name = type(exc).__name__
    message = str(exc)
    return RankFailure(
        rank=rank,
        type_name=type_name,
        message=message,
        traceback=traceback_text,
        collateral=is_collective_failure(type_name, message) or isinstance(exc, CollectiveReleasedError),
        node=node,
        pickled=pickled,
    )


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (its type name when it has none)."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def describe(exc: Optional[BaseException]) -> str:
    """One line for an exception: ``Type: message``."""
    if exc is None:
        return ""
    return f"{type(exc).__name__}: {exc}"
