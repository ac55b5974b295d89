"""The group's slot table: which worker holds each rank, the standby spares, and the places
(placement-group bundles) reserved but not in use.

Only the group's own package changes it, through these methods; everything else reads it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

from .ranks import RankInfo
from .state import SlotState

#: A place a worker can go: (placement group, bundle index).
Place = Tuple[Any, int]


@dataclasses.dataclass
class Slot:
    """One worker actor and where it lives."""

    actor: Any
    pg: Any
    bundle: int
    info: Dict[str, Any]
    rank_info: Optional[RankInfo] = None
    device: str = "cpu"
    state: SlotState = SlotState.STARTING
    error: str = ""
    #: Whether this worker has completed a formation of the group (until then it holds none of its
    #: peers' state, and the next formation treats it as new, whatever happened in between).
    joined: bool = False
    #: Its cell channel (``channels.py``): None until opened, False where it cannot have one (cells go as Ray calls).
    channel: Any = None

    @property
    def place(self) -> Place:
        return (self.pg, self.bundle)

    @property
    def gone(self) -> bool:
        """Dead or not answering."""
        return SlotState(self.state).gone

    def mark(self, state: SlotState, error: str = "") -> None:
        """Set this worker's state and the error that goes with it ("" clears it)."""
        self.state, self.error = SlotState(state), error


class SlotTable:
    """The ranks of a group in order, its spares, its free places and its placement groups."""

    def __init__(self) -> None:
        self._ranks: List[Slot] = []
        self.spares: List[Slot] = []
        self.free: List[Place] = []
        self.pgs: List[Any] = []

    def __len__(self) -> int:
        return len(self._ranks)

    def __iter__(self) -> Iterator[Slot]:
        return iter(list(self._ranks))

    def __getitem__(self, rank: int) -> Slot:
        return self._ranks[rank]

    def assign(self, slots: Sequence[Slot]) -> None:
        """The workers of ranks 0..n-1, in rank order."""
        self._ranks = list(slots)

    def put(self, rank: int, slot: Slot) -> Slot:
        """Give ``rank`` to ``slot``; returns the slot it replaces."""
        old, self._ranks[rank] = self._ranks[rank], slot
        return old

    def rank_of(self, actor: Any) -> Optional[int]:
        return next((i for i, s in enumerate(self._ranks) if s.actor is actor), None)

    def live_ranks(self) -> List[int]:
        return [i for i, s in enumerate(self._ranks) if not s.gone]

    def gone_ranks(self) -> List[int]:
        return [i for i, s in enumerate(self._ranks) if s.gone]

    def take_spare(self) -> Optional[Slot]:
        """The oldest standby worker, or None."""
        return self.spares.pop(0) if self.spares else None

    def everyone(self) -> List[Slot]:
        """Every worker: ranks and spares."""
        return self._ranks + self.spares
