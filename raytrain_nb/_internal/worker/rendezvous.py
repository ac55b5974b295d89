"""Rank 0's book of the group's collectives: who arrived at each, and what each waiting rank is told when it ends.

``collective.barrier()`` and ``broadcast_from_rank_zero()`` need no process group: every rank reports its arrival
to rank 0's worker (a call on its control channel, answered while rank 0 runs user code), and rank 0's worker
tells every waiting rank the outcome once the last one arrived. This module is that bookkeeping, with no Ray in
it: :class:`Rendezvous` records arrivals and says whom to tell what; ``worker/collective.py`` sends the calls.

A collective is named by a key ``(round, seq)``: the round numbers the cell or function call the driver sent (one
per dispatch, growing over the group's life), ``seq`` counts the collectives a rank entered in it. Entries of an
earlier round are dropped when a later one starts, so an interrupted cell, a restart or a rescale leaves nothing
that a later collective could meet.
"""
from __future__ import annotations

import threading
from typing import Any, Dict, List, Optional, Tuple

#: ``(round, seq)``: one collective of one cell.
Key = Tuple[int, int]
#: Who is told what: ``(rank, key, outcome)``.
Notice = Tuple[int, Key, "Outcome"]
#: What a waiting rank is told: ``("ok", payload)`` (rank 0's pickled data, or None), ``("error", message)`` (the
#: ranks disagree: raised as a ``CollectiveError``) or ``("released", message)`` (a rank stopped waiting).
Outcome = Tuple[str, Any]

BROADCAST = "broadcast_from_rank_zero"
BARRIER = "barrier"


class _Entry:
    """One collective: the op each arrived rank called, rank 0's payload, and how it ended (None: open)."""

    __slots__ = ("ops", "payload", "outcome")

    def __init__(self) -> None:
        self.ops: Dict[int, str] = {}
        self.payload: Any = None
        self.outcome: Optional[Outcome] = None


def _agreed(ops: Dict[int, str], payload: Any) -> Outcome:
    """The outcome once every rank arrived: rank 0's payload, or an error when the ranks called different ops."""
    kinds = sorted(set(ops.values()))
    if len(kinds) == 1:
        return ("ok", payload if kinds[0] == BROADCAST else None)
    by_op = "; ".join(f"rank {', '.join(str(r) for r in sorted(r for r, o in ops.items() if o == op))} "
                      f"called {op}()" for op in kinds)
    return ("error", f"the ranks called different collectives at the same point of the cell ({by_op}): every rank "
                     "must call the same collectives in the same order")


class Rendezvous:
    """On rank 0's worker: arrivals at each collective of the current round, the ranks that left it, and the handles
    of the ranks to tell.

    Every method that ends a collective returns the notices to send (rank 0's own included, delivered in its
    process); the caller sends them, outside this object's lock.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._round = 0
        self._entries: Dict[Key, _Entry] = {}
        self._gone: Dict[int, Outcome] = {}  # rank -> why it arrives at nothing more this round
        self._peers: Dict[int, Any] = {}

    def peer(self, rank: int) -> Any:
        """The handle rank ``rank`` introduced itself with (None: not introduced)."""
        with self._lock:
            return self._peers.get(rank)

    def _entry(self, key: Key) -> Optional[_Entry]:
        """The entry of ``key`` (made when new), or None when ``key`` is of a round that already ended."""
        if not self._at(key[0]):
            return None
        return self._entries.setdefault(key, _Entry())

    def _at(self, round_: int) -> bool:
        """Move to ``round_`` when it is new (what earlier rounds left goes); False for a round that ended."""
        if round_ < self._round:
            return False
        if round_ > self._round:
            self._round, self._entries, self._gone = round_, {}, {}
        return True

    def arrive(self, key: Key, world_size: int, rank: int, op: str, payload: Any = None,
               handle: Any = None) -> Tuple[Optional[Outcome], List[Notice]]:
        """Record ``rank`` at ``key`` calling ``op`` (``payload``: rank 0's pickled data; ``handle``: the rank's
        worker, when it introduces itself).

        Returns ``(outcome for the caller, or None: it waits to be told; the notices to send)``.
        """
        with self._lock:
            if handle is not None:
                self._peers[rank] = handle
            entry = self._entry(key)
            if entry is None:
                return ("released", f"{op}() was called by a cell that already ended"), []
            if entry.outcome is not None:  # the ranks there were told when it ended
                return entry.outcome, []
            if rank != 0 and rank not in self._peers:
                entry.outcome = ("error", f"rank {rank}'s worker is unknown to rank 0: run the cell again")
            elif self._gone:  # a rank that will not come: nobody waits for it
                entry.outcome = self._gone[min(self._gone)]
            if entry.outcome is not None:
                return entry.outcome, [(r, key, entry.outcome) for r in sorted(entry.ops)]
            entry.ops[rank] = op
            if rank == 0:
                entry.payload = payload
            if len(entry.ops) < world_size:
                return None, []
            entry.outcome = _agreed(entry.ops, entry.payload)
            return entry.outcome, [(r, key, entry.outcome) for r in sorted(entry.ops) if r != rank]

    def leave(self, round_: int, rank: int, outcome: Outcome) -> List[Notice]:
        """``rank`` arrives at nothing more in ``round_``: every open collective of it ends with ``outcome``, and
        so do the ones the others reach later."""
        with self._lock:
            if not self._at(round_) or rank in self._gone:
                return []
            self._gone[rank] = outcome
            notices = []
            for key, entry in self._entries.items():
                if entry.outcome is None:
                    entry.outcome = outcome
                    notices += [(r, key, outcome) for r in sorted(entry.ops) if r != rank]
            return notices

    def abandon(self, key: Key, rank: int, why: str) -> List[Notice]:
        """``rank`` stopped waiting at ``key`` with an error (``why``): the ranks waiting are released."""
        return self.leave(key[0], rank, ("released", f"rank {rank} stopped waiting ({why})"))

    def finished(self, round_: int, ranks: Dict[int, bool]) -> List[Notice]:
        """The call of ``round_`` ended on ``ranks`` (rank -> whether it failed) while others may wait: a failed
        rank releases them; one that returned is named as never arriving."""
        notices = []
        for rank, failed in sorted(ranks.items()):
            notices += self.leave(round_, rank, ("released", f"rank {rank} failed") if failed else (
                "error", f"rank {rank} finished the call without arriving at it"))
        return notices

    def missing(self, key: Key, world_size: int) -> List[int]:
        """The ranks that have not arrived at ``key`` (none once it ended)."""
        with self._lock:
            entry = self._entries.get(key)
            if entry is None:
                return [] if key[0] < self._round else list(range(world_size))
            if entry.outcome is not None:
                return []
            return sorted(set(range(world_size)) - set(entry.ops))
