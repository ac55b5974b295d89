"""What one rank's cell (or function call) came to: the one record the driver reads by name."""
from __future__ import annotations

import dataclasses
import pickle
from typing import Any, Dict, List, Optional

from ..errors import RankFailure

#: An exception pickled larger than this stays on the worker (its record still carries type, message, traceback).
MAX_PICKLED_EXCEPTION = 1 << 20


def pickle_exception(exc: BaseException) -> bytes:
    """``exc`` pickled for the driver (``RankFailure.exception()``), or ``b""`` when it does not survive a round
    trip here (a class whose ``__init__`` its ``args`` do not fit) or is larger than ``MAX_PICKLED_EXCEPTION``."""
    from ray import cloudpickle  # ray: a worker has it loaded; classes made in a cell pickle by value

    try:
        data = cloudpickle.dumps(exc)
        pickle.loads(data)
    except Exception:  # noqa: BLE001 - any failure to travel: the record's text stands in for it
        return b""
    return data if len(data) <= MAX_PICKLED_EXCEPTION else b""


@dataclasses.dataclass
class CellOutcome:
    """One rank's outcome of a cell or function call.

    Built by the worker when the cell ends (:meth:`Worker._end`), or by the driver for a rank
    that never answered: :meth:`died` (its process died or stopped answering) and :meth:`replaced`
    (it did not stop after an interrupt and was replaced).

    Attributes:
        rank: the world rank.
        failure: what the rank raised (None when it succeeded).
        value: the rendered value of the cell's last expression, or the function's return value.
        outputs: output produced since the last poll.
        metrics: ``report()`` records since the last poll.
        reports: how many times the cell called ``report()``.
        forwards: forward passes of prepared models during the cell.
        shards_stepped: this rank holds sharded (FSDP2) models whose optimizers stepped since its last mirror (or
            that were never mirrored): the driver mirrors the group's shards after the cell, however they were built.
        interrupted: an interrupt reached the rank's user code.
        pg_broken: the rank's process group was broken to release a collective.
        fingerprint: fingerprints of the plain variables after the cell.
        duration: seconds the cell ran on the worker.
        dead: the rank's worker died or stopped answering during the cell.
        replaced: the rank's worker was replaced during the cell.
        pg_sequence: after an interrupt, the collectives the rank issued on each of its process groups when the
            cell ended (``ProcessGroupState.sequence``; None: not interrupted, no intact gloo group, or sharded
            models, which re-shard on a new group).
    """

    rank: int
    failure: Optional[RankFailure] = None
    value: Any = None
    outputs: List[Any] = dataclasses.field(default_factory=list)
    metrics: List[Dict[str, Any]] = dataclasses.field(default_factory=list)
    reports: int = 0
    forwards: int = 0
    shards_stepped: bool = False
    interrupted: bool = False
    pg_broken: bool = False
    fingerprint: Dict[str, str] = dataclasses.field(default_factory=dict)
    duration: float = 0.0
    dead: bool = False
    replaced: bool = False
    pg_sequence: Optional[List[int]] = None

    def to_wire(self) -> List[Any]:
        """The fields as a list, in declaration order: what Ray sends back from a cell. A list of plain values goes
        through Ray's msgpack path; only the values that are not plain (a failure, a rendered value, output
        items) are pickled, where the dataclass would be pickled whole (about a tenth of a millisecond a call)."""
        return [getattr(self, name) for name in _FIELDS]

    @classmethod
    def from_wire(cls, data: List[Any]) -> "CellOutcome":
        """The outcome :meth:`to_wire` sent."""
        return cls(*data)

    @classmethod
    def died(cls, rank: int, failure: RankFailure) -> "CellOutcome":
        """A rank whose worker died or stopped answering."""
        return cls(rank=rank, failure=failure, dead=True)

    @classmethod
    def replaced_rank(cls, rank: int, failure: RankFailure) -> "CellOutcome":
        """A rank whose worker was replaced because it did not stop."""
        return cls(rank=rank, failure=failure, replaced=True)

    @property
    def own_failure(self) -> bool:
        """It raised an error of its own (not only released from a collective by a peer's)."""
        return self.failure is not None and not self.failure.collateral


_FIELDS = tuple(f.name for f in dataclasses.fields(CellOutcome))
