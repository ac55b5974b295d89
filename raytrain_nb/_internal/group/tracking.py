"""A group's tracked run (``group.track("mlflow")``, ``%%distributed --track mlflow``): every report of its cells
at its report index, its pushed values, rollbacks and recoveries, into the run's one MLflow or W&B run.

The tracker observes the group's core (its metric records, state changes and events) on the driver; what it logs
goes out on its own thread (:mod:`raytrain_nb._internal.tracking`), so a cell never waits for a tracking server.
"""
from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Dict, List, Mapping, Optional

from ..errors import CheckpointError, GroupError
from ..tracking.reports import ReportGrouper, plain_params
from ..tracking.tracker import KINDS, Tracker, TrackerSpec, open_tracker
from .state import GroupState

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)


def track(core: "GroupCore", tracker: Any, options: Mapping[str, Any]) -> Tracker:
    """Attach a tracker to the group (once per kind: asked again, the attached one is returned).

    Args:
        tracker: ``"mlflow"``, ``"wandb"``, or an ``MLflowLoggerCallback`` / ``WandbLoggerCallback`` (its settings).
        options: the callback's keyword arguments, with a name (``tracking_uri=...``, ``project=...``).

    Raises:
        GroupError: an unknown tracker, or the group is shut down.
        ImportError: the tracker's library is not installed (naming the extra).
    """
    spec = _spec(tracker, options)
    attached = core.trackers.get(spec.kind)
    if attached is not None and not attached.closed:
        return attached
    if core.state is GroupState.SHUTDOWN:
        raise GroupError("the group is shut down: start a new one, then track it")
    pushed = plain_params(dict(core.pushed))
    tracked = open_tracker(spec, core.run_storage.url, core.name, pushed)
    GroupTracking(core, tracked, pushed)
    core.trackers[spec.kind] = tracked
    return tracked


def _spec(tracker: Any, options: Mapping[str, Any]) -> TrackerSpec:
    if isinstance(tracker, str):
        if tracker not in KINDS:
            raise GroupError(f"tracker={tracker!r} is unknown: use 'mlflow' or 'wandb' (pip install "
                             f"'raytrain_nb[mlflow]' or 'raytrain_nb[wandb]')")
        return TrackerSpec(tracker, dict(options))
    spec = getattr(tracker, "spec", tracker)
    if not isinstance(spec, TrackerSpec):
        raise GroupError(f"tracker={tracker!r} is not a tracker: pass 'mlflow', 'wandb', or an "
                         "MLflowLoggerCallback / WandbLoggerCallback from raytrain_nb.integrations")
    return TrackerSpec(spec.kind, {**spec.options, **options}) if options else spec


class GroupTracking:
    """Feeds one tracker from one group's core: reports (grouped across ranks), pushed values, events."""

    def __init__(self, core: "GroupCore", tracker: Tracker, pushed: Dict[str, Any]) -> None:
        self.core = core
        self.tracker = tracker
        self.pushed = dict(pushed)
        self.grouper = ReportGrouper(lambda: core.num_workers, self._emit)
        self.recovering = False
        core.subscribe_metrics(self._on_records)
        core.subscribe(self._on_state)
        core.subscribe_events(self._on_event)

    def _on_records(self, records: Any) -> None:
        if not self.tracker.closed:
            self.grouper.on_records(records)

    def _emit(self, index: int, metrics_by_rank: List[Dict[str, Any]], when: float, checkpoint: Optional[str]) -> None:
        where = None
        if checkpoint is not None:
            try:
                where = (checkpoint, self.core.run_storage.manager.get(checkpoint).path)
            except CheckpointError:  # not committed (a rank never reported it), or pruned at once
                where = None
        self.tracker.log_report(index, metrics_by_rank, when or None, where)

    def _on_state(self, old: GroupState, new: GroupState) -> None:
        if self.tracker.closed:
            return
        if old is GroupState.RUNNING and new is not GroupState.RUNNING:
            self.grouper.flush()  # the cell ended: reports some ranks never made go on with what came
        if new is GroupState.SHUTDOWN:
            self.tracker.close()
            return
        if new is GroupState.RECOVERING:
            self.recovering = True
        elif self.recovering and new is GroupState.IDLE:
            self.recovering = False
            self.tracker.note("recovery", f"the group re-formed with {self.core.num_workers} workers (restart or "
                                          "rescale); later reports log at later steps")
        pushed = plain_params(dict(self.core.pushed))
        changed = {k: v for k, v in pushed.items() if self.pushed.get(k) != v}
        if changed:
            self.pushed.update(changed)
            self.tracker.log_params(changed)

    def _on_event(self, kind: str, info: Dict[str, Any]) -> None:
        if self.tracker.closed or kind not in ("rollback", "load"):
            return
        index = info.get("report_index")
        if kind == "rollback":
            run = f" of run {info['run']}" if info.get("run") else ""
            text = f"rolled back to snapshot {info.get('snapshot')}{run}; the next reports log after step {index}"
        else:
            text = f"loaded {info.get('checkpoint')}; the next reports log after step {index}"
        self.tracker.note(kind, text, index if isinstance(index, int) else None)
