"""Driver side of snapshots: take one on every rank (between cells or at a step boundary),
write it in the background, roll every rank back to one, and load any state checkpoint.

``WorkerGroup.checkpoint`` / ``rollback`` / ``load`` / ``checkpoints`` call into here; the group's
:class:`~raytrain_nb._internal.checkpoint.run_storage.RunStorage` owns the checkpoint manager.
"""
from __future__ import annotations

import dataclasses
import logging
import threading
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Sequence, Union

from ..checkpoint.manager import CheckpointEntry, CheckpointManager
from ..checkpoint.sources import as_checkpoint
from ..checkpoint.staging import discard_dir
from ..checkpoint.storage import join
from ..errors import CheckpointError, WorkerLostError
from ..waits import get_within, join_within, wait_within
from ..worker.snapshot_io import read_meta, state_files
from . import timing
from .channel_calls import collect_over
from .fanout import FANOUT, ReplyKind, classify
from .state import GroupState

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class RollbackResult:
    """What :meth:`WorkerGroup.rollback` did."""

    name: str
    restored: List[str]
    changed: List[str]
    verb: str = "rolled back to"

    def __str__(self) -> str:
        text = f"{self.verb} {self.name}: restored {', '.join(self.restored) or 'nothing'}"
        if self.changed:
            text += (f"; not restored and changed since the snapshot: {', '.join(self.changed)} "
                     "(name them with --vars to save them too)")
        return text


def checkpoint(core: "GroupCore", name: Optional[str], var_names: Sequence[str], blocking: bool,
               timeout_s: float) -> Optional[CheckpointEntry]:
    """Snapshot the tracked state of every rank (see :meth:`WorkerGroup.checkpoint`)."""
    run = core.run_storage
    if run.background_error:
        err, run.background_error = run.background_error, None
        raise CheckpointError(f"an earlier background checkpoint failed: {err}")
    staged = run.manager.begin("snapshot", name)
    actors = [s.actor for s in core.slots]
    try:
        if core.state is GroupState.RUNNING:  # a step boundary: the next report() on every rank
            _at_step_boundary(core, staged, var_names, timeout_s)
        else:
            core.check_usable()
            request = [staged, list(var_names), not blocking]  # one argument a rank (Worker.snapshot_packed)
            replies = core.collect([a.snapshot_packed.remote(request) for a in actors],
                                   timing.SNAPSHOT_WRITE_S, "snapshot", collective=True)
            if core.mirrors.sharded or any(r.get("sharded") for r in replies):  # a DDP group has no shards to mirror
                core.mirrors.refresh_safely(core)  # between cells: a sharded group's shards to the buddies too
            if not blocking:
                waits = [a.snapshot_wait.remote(timing.BACKGROUND_WRITE_S) for a in actors]
                thread = threading.Thread(target=_finish_background, args=(core, staged, waits),
                                          name="rtnb-snapshot-commit", daemon=True)
                run.background = thread
                thread.start()
                return None
    except BaseException:
        discard_dir(staged)
        raise
    return run.manager.commit(staged, "snapshot", _metrics_of(core))


def _at_step_boundary(core: "GroupCore", staged: Any, var_names: Sequence[str], timeout_s: float) -> None:
    """Snapshot at the next ``report()`` of every rank of the running cell, or cancel and raise.

    The request goes out through the fan-out; then the one wait of its own here: for a ``report()`` on every
    rank, up to ``timeout_s`` (the user's), since the cell decides when that comes.
    """
    slots = list(core.slots)
    try:
        FANOUT.ask(slots, lambda s: s.actor.request_snapshot.remote(staged, list(var_names)), timing.CONTROL_CALL_S,
                   "every rank to accept the snapshot request").check(
            error=CheckpointError, hint="%dist_status shows which ranks are stopped or dead; try again between cells")
        waits = [s.actor.snapshot_wait.remote(timeout_s) for s in slots]
        ready, late = wait_within(waits, timeout_s + timing.CONTROL_CALL_S,
                                  "a report() on every rank to take the snapshot at", log=logger)
        taken = not late and not any(r.get("timeout") for r in core.collect(ready, timing.SNAPSHOT_ANSWER_S,
                                                                            "snapshot"))
    except BaseException:
        _cancel(slots)
        raise
    if not taken:
        _cancel(slots)
        raise CheckpointError(f"no report() came on every rank within {timeout_s:g} s while the cell "
                              "ran, so no consistent snapshot could be taken: try again between cells")


def _cancel(slots: List[Any]) -> None:
    """Withdraw a snapshot request from every rank (a rank that does not answer in time is only logged)."""
    replies = FANOUT.ask(slots, lambda s: s.actor.cancel_snapshot.remote(), timing.CONTROL_CALL_S,
                         "every rank to withdraw the snapshot request")
    late = replies.ranks(ReplyKind.LATE)
    if late:
        logger.warning("rank(s) %s did not confirm within %g s that the snapshot request is withdrawn; "
                       "%%dist_status shows which ranks are stopped or dead", ", ".join(map(str, late)),
                       timing.CONTROL_CALL_S)


def _metrics_of(core: "GroupCore") -> Dict[str, Any]:
    return dict(core.latest_metrics.get(0, {}))


def _finish_background(core: "GroupCore", staged: Any, waits: List[Any]) -> None:
    run = core.run_storage
    try:
        written = get_within(waits, timing.BACKGROUND_WRITE_S + timing.CONTROL_CALL_S,
                             f"every rank to write the background snapshot {staged.name}",
                             labels=[f"rank {r}" for r in range(len(waits))], error=CheckpointError, log=logger,
                             hint="check the storage path and %dist_status")
        slow = [r for r, res in enumerate(written) if res.get("timeout")]
        if slow:
            raise CheckpointError(f"rank(s) {', '.join(map(str, slow))} did not write the background snapshot "
                                  f"within {timing.BACKGROUND_WRITE_S:g} s: check the storage path")
        run.manager.commit(staged, "snapshot", _metrics_of(core))
    except Exception as exc:  # noqa: BLE001 - reported in the next cell
        discard_dir(staged)
        _, cause = classify(exc, -1, None)
        if isinstance(cause, WorkerLostError):
            why = f"a worker died while writing it ({cause.cause})"
        else:
            why = f"{type(cause).__name__}: {str(cause).splitlines()[0] if str(cause) else ''}"
        run.background_error = f"{staged.name}: {why}"
        logger.warning("background checkpoint %s failed: %s", staged.name, why)


def wait_background(core: "GroupCore") -> None:
    """Wait for a background checkpoint to commit (``--async``)."""
    thread = core.run_storage.background
    if thread is not None:
        if not join_within(thread, timing.BACKGROUND_WRITE_S, "the background checkpoint to be written", logger):
            raise CheckpointError(f"the background checkpoint is still being written after "
                                  f"{timing.BACKGROUND_WRITE_S:g} s: check the storage path, then try again")


def rollback(core: "GroupCore", name_or_index: Union[str, int], run: Optional[str],
             allow_pickle: bool) -> RollbackResult:
    """Load a snapshot into every rank's objects in place (see :meth:`WorkerGroup.rollback`)."""
    core.check_usable()
    manager = core.run_storage.manager if run is None else CheckpointManager.load(
        join(core.run_storage.url.rsplit("/", 1)[0], run))
    wait_background(core)
    snapshots = manager.list("snapshot")
    if name_or_index == "latest":
        if not snapshots:
            raise CheckpointError(f"no snapshot to roll back to in {manager.run_dir}: take one with "
                                  "%dist_checkpoint (group.checkpoint())")
        entry = snapshots[-1]
    else:
        entry = manager.get(name_or_index)
    if entry.kind != "snapshot":
        raise CheckpointError(f"{entry.name} is a reported checkpoint (your own files): load it in a cell with "
                              "raytrain_nb.get_checkpoint() or Checkpoint; rollback takes snapshots")
    # once here, not on every rank: a committed directory does not change
    files, meta = state_files(entry.path), read_meta(entry.path)
    request = [entry.path, allow_pickle, files, meta]  # one argument a rank (Worker.rollback_packed)
    results = _on_every_rank(core, "rollback", request, meta, "roll back")
    changed = sorted({n for r in results for n in r["changed"]})
    if core.mirrors.sharded:  # the buddies keep the rolled-back shards
        core.mirrors.refresh_safely(core)
    core.event("rollback", snapshot=entry.name, run=run, report_index=core.run_storage.report_base - 1)
    return RollbackResult(entry.name, results[0]["restored"], changed)


def load(core: "GroupCore", source: Any, allow_pickle: bool) -> RollbackResult:
    """Load a state checkpoint into every rank's same named objects (see :meth:`WorkerGroup.load`)."""
    core.check_usable()
    url = as_checkpoint(source, "group.load").url
    files, meta = state_files(url), read_meta(url)  # on the driver, once: a wrong one fails before any rank loads
    wait_background(core)
    request = [url, allow_pickle, files, meta]  # one argument a rank (Worker.load_state_packed)
    results = _on_every_rank(core, "load_state", request, meta, "load a checkpoint into")
    changed = sorted({n for r in results for n in r["changed"]})
    if core.mirrors.sharded:  # the buddies keep the loaded shards
        core.mirrors.refresh_safely(core)
    core.event("load", checkpoint=url, report_index=core.run_storage.report_base - 1)
    return RollbackResult(url, results[0]["restored"], changed, verb="loaded")


def _on_every_rank(core: "GroupCore", method: str, request: List[Any], meta: Dict[str, Any],
                   what: str) -> List[Dict[str, Any]]:
    """Every rank's answer to ``Worker.<method>_packed(request)``: over the ranks' channels where the state holds
    no sharded part (each rank loads its own files: nothing meets in a collective), else as Ray calls whose
    ranks are released from the process group's collectives once one of them died."""
    def call(slot: Any) -> Any:
        return getattr(slot.actor, f"{method}_packed").remote(request)

    if not meta.get("sharded"):
        answers = collect_over(core, method, request, timing.SNAPSHOT_WRITE_S, what, call)
        if answers is not None:
            return answers
    return core.collect([call(s) for s in core.slots], timing.SNAPSHOT_WRITE_S, what, collective=True)
