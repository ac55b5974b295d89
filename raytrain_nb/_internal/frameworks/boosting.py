"""The XGBoost and LightGBM framework backends: each cell runs inside the library's own collective.

``xgboost``: for every cell the driver starts a ``RabitTracker`` (a tracker serves one communicator
session) and each rank runs the cell inside ``xgboost.collective.CommunicatorContext`` with the tracker's
address and a task id that orders XGBoost's ranks like the group's, so ``xgboost.train(...)`` in a cell
trains one model over every rank's data. ``lightgbm``: for every cell each rank picks a free port and
:func:`get_network_params` returns the group's current ``machines``, ``local_listen_port`` and
``num_machines``. A rank that raises closes its sockets when the cell ends (LightGBM: ``LGBM_NetworkFree``;
XGBoost: leaving the communicator), a rank that dies has them closed by the OS, so peers blocked in the
library's collective fail at once instead of waiting for its timeout.
"""
from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import weakref
from typing import Any, Dict, Iterator, List, Optional, Sequence

from ..extras import require
from ..waits import get_within, join_within
from ..worker.boosters import is_booster
from ..worker.framework import STOP_AFTER_PEER_FAILURE_S, FrameworkBackend
from ..worker.walk import walk

logger = logging.getLogger(__name__)

#: Seconds the tracker waits for every rank to connect (and to finish) at the start and end of a cell.
TRACKER_TIMEOUT_S = 300
#: Seconds the driver waits for the tracker's thread after a cell (it ends once every rank finalized).
TRACKER_JOIN_S = 5.0
#: Seconds every rank has to answer with a free port for LightGBM.
PORTS_S = 30.0
LOOPBACK = "127.0.0.1"

_network_params: Optional[Dict[str, Any]] = None
_network_lock = threading.Lock()


def get_network_params() -> Dict[str, Any]:
    """LightGBM's network parameters for this rank in the current cell or training function
    (Ray Train's ``get_network_params``): ``{"num_machines", "local_listen_port", "machines"}``.

    Pass them to ``lightgbm.train(params={..., **get_network_params()})`` with
    ``tree_learner="data_parallel"``. Outside a group running the ``lightgbm`` backend: ``{}`` and a warning.
    """
    with _network_lock:
        if not _network_params:
            logger.warning("get_network_params() was called outside a LightGBMTrainer's training function or a "
                           "group with backend='lightgbm' (%%distributed --backend lightgbm): returning {}")
            return {}
        return dict(_network_params)


def _set_network_params(params: Optional[Dict[str, Any]]) -> None:
    global _network_params
    with _network_lock:
        _network_params = params


def _rounds(booster: Any) -> int:
    """The boosting rounds in ``booster`` (XGBoost: ``num_boosted_rounds``; LightGBM: ``current_iteration``)."""
    for method in ("num_boosted_rounds", "current_iteration"):
        if hasattr(booster, method):
            try:
                return int(getattr(booster, method)())
            except Exception:  # noqa: BLE001 - a booster being torn down has not trained
                return 0
    return 0


class _RoundsSeen:
    """A count that grows by every round a booster bound to a name gained since this rank last looked (a new
    booster counts whole): a cell during which it grew trained, so it is not a setup cell and new ranks do not
    replay it (they get the booster from a live peer instead)."""

    def __init__(self) -> None:
        self._seen: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()
        self._total = 0

    def count(self, namespace: Dict[str, Any]) -> int:
        for _, obj in walk(namespace, is_booster):
            if not is_booster(obj):
                continue
            rounds = _rounds(obj)
            try:
                before = self._seen.get(obj, 0)
                self._seen[obj] = rounds
            except TypeError:  # not weakly referable: count it whole each time it is seen
                before = 0
            self._total += max(0, rounds - before)
        return self._total


#: This process's count (a worker's; the backend objects travel to the workers by pickle, so they hold none).
_ROUNDS_SEEN = _RoundsSeen()


class _BoostingBackend(FrameworkBackend):
    """What XGBoost and LightGBM share: a cell that grew a booster trained."""

    def training_steps(self, namespace: Dict[str, Any]) -> int:
        return _ROUNDS_SEEN.count(namespace)


class XGBoostBackend(_BoostingBackend):
    """``xgboost``: a tracker on the driver and the communicator on every rank, per cell."""

    name = "xgboost"
    extra = "xgboost"
    stop_after_peer_failure_s = STOP_AFTER_PEER_FAILURE_S

    @contextlib.contextmanager
    def driver_cell(self, workers: Sequence[Any], local: bool) -> Iterator[List[Any]]:
        tracker_mod = require("xgboost.tracker", "xgboost")
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        host = LOOPBACK if local else ray.util.get_node_ip_address()
        tracker = tracker_mod.RabitTracker(n_workers=len(workers), host_ip=host, sortby="task",
                                           timeout=TRACKER_TIMEOUT_S)
        tracker.start()
        waiter = threading.Thread(target=tracker.wait_for, name="xgboost-tracker", daemon=True)
        waiter.start()
        args = dict(tracker.worker_args())
        try:
            # sortby="task": XGBoost's rank is the order of the task ids, i.e. the position in ``workers``
            yield [dict(args, dmlc_task_id=f"[raytrain_nb-rank={i:08}]") for i in range(len(workers))]
        finally:
            if not join_within(waiter, TRACKER_JOIN_S, "XGBoost's tracker to end after the cell", logger):
                # a rank never connected or died: the tracker gives up after TRACKER_TIMEOUT_S on its own
                logger.debug("the XGBoost tracker of this cell is still waiting; it times out by itself")

    @contextlib.contextmanager
    def worker_cell(self, spec: Any) -> Iterator[None]:
        collective = require("xgboost.collective", "xgboost")
        with collective.CommunicatorContext(**spec):
            yield


class LightGBMBackend(_BoostingBackend):
    """``lightgbm``: a free port per rank, gathered into ``get_network_params()``, per cell."""

    name = "lightgbm"
    extra = "lightgbm"
    stop_after_peer_failure_s = STOP_AFTER_PEER_FAILURE_S

    @contextlib.contextmanager
    def driver_cell(self, workers: Sequence[Any], local: bool) -> Iterator[List[Any]]:
        refs = [w.actor.free_port.remote() for w in workers]
        ports = get_within(refs, PORTS_S, "every rank to pick a free port for LightGBM", log=logger,
                           labels=[f"rank {i}" for i in range(len(workers))])
        hosts = [LOOPBACK if local else w.info.get("node_ip", LOOPBACK) for w in workers]
        machines = ",".join(f"{h}:{p}" for h, p in zip(hosts, ports))
        yield [{"num_machines": len(workers), "local_listen_port": int(p), "machines": machines} for p in ports]

    @contextlib.contextmanager
    def worker_cell(self, spec: Any) -> Iterator[None]:
        _set_network_params(spec)
        try:
            yield
        finally:
            _free_network()

    def release(self, spec: Any) -> bool:
        """Put ``/dev/null`` under LightGBM's sockets (``dup2``): its next ``recv`` fails and the cell raises
        ``LightGBMError``, where a peer that closed its socket cleanly would leave it spinning on ``recv() == 0``.
        The descriptors stay LightGBM's, so freeing its network later closes only the ``/dev/null`` copies."""
        psutil = require("psutil", "lightgbm")
        ports = {int(m.rsplit(":", 1)[1]) for m in spec["machines"].split(",")}
        mine = int(spec["local_listen_port"])
        fds = [c.fd for c in psutil.Process().net_connections(kind="tcp") if c.fd != -1 and (
            (c.laddr and c.laddr.port == mine) or (c.raddr and c.raddr.port in ports - {mine}))]
        null = os.open(os.devnull, os.O_RDWR)
        try:
            for fd in fds:
                os.dup2(null, fd)
        finally:
            os.close(null)
        return bool(fds)


def _free_network() -> None:
    """Close LightGBM's sockets on this rank (a no-op when it has none), so peers waiting on it fail now."""
    basic = sys.modules.get("lightgbm.basic")
    if basic is not None:
        try:
            basic._LIB.LGBM_NetworkFree()
        except Exception:  # noqa: BLE001 - best effort: the library may be mid-teardown
            logger.debug("LGBM_NetworkFree failed", exc_info=True)


XGBOOST = XGBoostBackend()
LIGHTGBM = LightGBMBackend()
