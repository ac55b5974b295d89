"""The group's plain data that users see: status rows, cell results and the cell history."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional

from .state import SlotState


@dataclasses.dataclass
class WorkerStatus:
    """One row of :meth:`WorkerGroup.status`."""

    rank: int
    node: str
    pid: int
    device: str
    state: SlotState
    last_metrics: Dict[str, Any]
    error: str = ""
    #: CPU %, RSS, memory limit and GPU as last sampled (``cpu``, ``rss``, ``mem_flag``, ``gpu_util``...; see
    #: ``worker/resources.py``); empty until the rank answered a ping or a poll.
    resources: Dict[str, Any] = dataclasses.field(default_factory=dict)
    step_time: Optional[float] = None  # seconds between its last two report() calls in a cell
    slow: bool = False  # its step time stayed above 1.5x its peers' median (``group/vitals.py``)
    #: a sharded (FSDP2) group: the strategy, the mesh size and this rank's share (``fsdp2 1/2: 3.1 MiB``), else ""
    shard: str = ""


@dataclasses.dataclass
class CellResult:
    """What :meth:`WorkerGroup.run` returns: each rank's displayed value and the wall time."""

    values: Dict[int, Any]
    duration: float

    @property
    def value(self) -> Optional[str]:
        """The ``text/plain`` value of the lowest rank that returned one."""
        for rank in sorted(self.values):
            if self.values[rank] is not None:
                return self.values[rank][0].get("text/plain")
        return None


@dataclasses.dataclass
class CellRecord:
    """A cell that ran without error on every rank (what a new rank replays if ``setup``)."""

    cell_id: int
    source: str
    setup: bool
    reports: int
    time: float
