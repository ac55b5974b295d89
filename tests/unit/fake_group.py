"""A stand-in for WorkerGroup with the observer API the dashboard uses (no Ray)."""
from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from raytrain_nb import GroupState, WorkerStatus
from raytrain_nb._internal.group.kinds import kind_for
from raytrain_nb._internal.group.plans import plan_recovery
from raytrain_nb._internal.group.state import SlotState


class FakeGroup:
    """Workers, states and observers, stepped by hand; records the public calls made on it."""

    def __init__(self, n: int = 2) -> None:
        self.name = "run-fake"
        self.backend = "gloo"
        self.state = GroupState.IDLE
        self.background: Optional[Any] = None
        self.workers = [WorkerStatus(rank=r, node="10.0.0.1", pid=100 + r, device="cpu", state="idle",
                                     last_metrics={}) for r in range(n)]
        self.entries: List[Any] = []
        self.calls: List[str] = []
        self.fail: Dict[str, Exception] = {}
        self._observers: List[Callable[..., None]] = []
        self._metric_observers: List[Callable[..., None]] = []

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    def subscribe(self, cb: Callable[..., None]) -> None:
        self._observers.append(cb)

    def subscribe_metrics(self, cb: Callable[..., None]) -> None:
        self._metric_observers.append(cb)

    def status(self, ping: bool = True) -> List[WorkerStatus]:
        return list(self.workers)

    def set_state(self, new: GroupState, **worker_states: str) -> None:
        for rank, st in worker_states.items():
            self.workers[int(rank[1:])].state = st
        old, self.state = self.state, new
        for cb in self._observers:
            cb(old, new)

    def report(self, rank: int, metrics: Dict[str, Any], t: float, total: Optional[int] = None) -> None:
        rec: Dict[str, Any] = {"rank": rank, "time": t, "metrics": metrics}
        if total is not None:
            rec["total"] = total
        for cb in self._metric_observers:
            cb([rec])

    def checkpoints(self, kind: Optional[str] = None) -> List[Any]:
        return list(self.entries)

    def _call(self, name: str, result: Any = None) -> Any:
        self.calls.append(name)
        if name in self.fail:
            raise self.fail[name]
        return result

    def interrupt(self) -> Any:
        return self._call("interrupt", [])

    def shutdown(self) -> None:
        self._call("shutdown")
        self.set_state(GroupState.SHUTDOWN)

    def restart(self, from_checkpoint: Any = None) -> List[int]:
        """The real restart's plan decides (which ranks are replaced, or the error), not a rule of its own."""
        gone = [w.rank for w in self.workers if SlotState(w.state).gone]
        live = [w.rank for w in self.workers if w.rank not in gone]
        plan = plan_recovery(kind_for(self.backend), "restart", live=live, gone=gone,
                             from_checkpoint=from_checkpoint is not None)
        return self._call("restart", list(plan.new_ranks))
