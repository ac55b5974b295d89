"""The worker's part in keeping sharded models whole: mirrors of its shards, a buddy's mirrors, re-sharding.

Each rank takes a mirror of its own shards (:func:`.sharded_mirror.take`) when the driver asks; the driver hands it
to the rank's buddy, which keeps it in its memory (:meth:`MirroringWorker.mirror_keep`). After the process group
re-forms, every rank re-shards its sharded modules in place from the mirrors (:meth:`MirroringWorker.reshard`).

With a cadence (``mirror_shards(True, every=K)``) each rank also takes one on its training thread inside every K-th
``report()`` of a whole-group cell (:meth:`MirroringWorker._mirror_step`), puts it in the object store and names it
in its next poll; the driver has the buddy stage it (:meth:`MirroringWorker.mirror_stage`, on the control threads, so
never behind the buddy's cell). Points are ``(epoch, n)``: ``epoch`` from the driver's last refresh, ``n`` counting
the takes since, the same on every rank as every rank reports at the same step.
"""
from __future__ import annotations

import logging
import sys
import threading
from typing import Any, Dict, List, Optional, Tuple

from ..errors import RecoveryError
from . import shard_watch, sharded_io, sharded_mirror
from .sharded import ShardedPull, full_state, is_sharded, local_share, mesh_of
from .snapshot import find_tracked

logger = logging.getLogger(__name__)

#: The worker's mirror calls answered on the control threads, while a cell runs.
CONTROL_METHODS = ("mirror_stage", "mirror_own", "mirror_own_hand", "mirror_committed")

#: At most this many of its own mid-cell takes a rank keeps referenced (in the object store), from the point in use
#: on, for a restart whose buddy died (normally the point in use and the one or two taken since).
OWN_KEPT = 8

Point = Tuple[int, int]


def _version(tracked: Any) -> float:
    """How far this rank's sharded optimizers have stepped (their ``step`` counts summed): a change means training
    since the last mirror."""
    total = 0.0
    for opt, _ in tracked.sharded_optimizers.values():
        for state in opt.state.values():
            step = state.get("step") if isinstance(state, dict) else None
            if step is not None:
                total += float(step.to_local().sum() if hasattr(step, "to_local") else step)
    return total


def check_pull(name: str, value: Any) -> None:
    """Raise :class:`~.sharded.ShardedPull` for a sharded model (the driver gathers it or refuses), else nothing."""
    if is_sharded(value):
        raise ShardedPull(name, local_share(value))


class MirroringWorker:
    """Mirrors of sharded models on a worker (the actor's part; see the module)."""

    namespace: Dict[str, Any]
    rank: int
    _cells: Any

    session: Any
    _partial: bool

    def _mirror_store(self) -> Dict[int, Dict[Any, Any]]:
        """Rank -> point -> the mirror this worker keeps for it (the committed point and points being staged)."""
        store = self.__dict__.get("_held_mirrors")
        if store is None:
            self.__dict__.setdefault("_held_lock", threading.Lock())
            store = self.__dict__["_held_mirrors"] = {}
        return store

    def _mirror_state(self) -> Dict[str, Any]:
        """This rank's own side of the cadence: every K reports, its point, its last takes and the unsent ones."""
        state = self.__dict__.get("_mirror_cadence")
        if state is None:
            state = self.__dict__["_mirror_cadence"] = {"every": 0, "point": None, "own": {}, "out": [],
                                                        "lock": threading.Lock()}
        return state

    def sharded_share(self) -> Optional[Dict[str, Any]]:
        """This rank's share of its sharded models (strategy, mesh size, bytes here and in all), or None."""
        return self._cells.call(lambda: sharded_io.share(find_tracked(self.namespace, strict=False)))

    def mirror_take(self, require_clean: bool = False, point: Optional[Point] = None,
                    every: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """A mirror of this rank's shards now, or None without sharded models; ``point``: the driver's refresh
        names it (a new epoch of mid-cell points), ``every``: take one every that many reports too (0: never).

        Raises:
            RecoveryError: with ``require_clean``, this rank trained since its last mirror (then a fresh mirror
                would not match the others' mirror point).
        """
        if "torch.distributed.tensor" not in sys.modules:  # nothing can be sharded: no walk, no cell-thread call
            if every is not None:
                self._set_cadence(0)
            return None
        return self._cells.call(self._take_mirror, require_clean, point, every)

    def _take_mirror(self, require_clean: bool, point: Optional[Point] = None,
                     every: Optional[int] = None) -> Optional[Dict[str, Any]]:
        tracked = find_tracked(self.namespace, strict=False)
        if every is not None:
            self._set_cadence(every if tracked.sharded else 0)  # the step path pays nothing where nothing is sharded
        if not tracked.sharded:
            return None
        if require_clean and self._stepped_since_mirror(tracked):
            raise RecoveryError(f"rank {self.rank} trained since its last mirror and its mirror is gone with its "
                                "buddy, so no consistent copy of every rank's shards is left: restart from a "
                                "snapshot (%dist_restart --from-checkpoint NAME)")
        mirror = sharded_mirror.take(tracked)
        # after the take: taking a mirror of an optimizer that never stepped makes its state (DCP's zero-lr step)
        self.__dict__["_mirror_version"] = _version(tracked)
        if point is not None:
            state = self._mirror_state()
            with state["lock"]:
                state["point"], state["own"], state["out"] = tuple(point), {}, []
        return mirror

    def _set_cadence(self, every: int) -> None:
        """Take a mirror inside every ``every``-th report (0: never; the session's hook goes)."""
        self._mirror_state()["every"] = max(0, int(every))
        session = getattr(self, "session", None)  # a worker before its first formation has none
        if session is not None:
            session.on_step = self._mirror_step if every else None

    def _mirror_step(self, index: int) -> None:
        """On the training thread inside the ``index``-th report of the cell: every K-th one of a whole-group cell,
        this rank's mirror into the object store, named (by its point) in the next poll. Never fails the report."""
        state = self._mirror_state()
        if not state["every"] or (index + 1) % state["every"] or state["point"] is None or self._partial:
            return
        try:
            import ray  # ray: the worker runs inside it; loaded on the first mid-cell mirror only

            tracked = find_tracked(self.namespace, strict=False)
            if not tracked.sharded:
                return
            mirror = sharded_mirror.take(tracked)
            self.__dict__["_mirror_version"] = _version(tracked)
            ref = ray.put(mirror)
        except Exception:  # noqa: BLE001 - a mirror is the driver's spare copy: the user's step goes on
            logger.warning("rank %d could not mirror its shards at report %d", self.rank, index + 1, exc_info=True)
            return
        with state["lock"]:
            epoch, n = state["point"]
            point = state["point"] = (epoch, n + 1)
            own = state["own"]
            own[point] = ref
            for old in sorted(own)[:-OWN_KEPT]:
                del own[old]
            state["out"].append({"point": point, "ref": ref, "report": index + 1})

    def _mirror_poll(self) -> Dict[str, Any]:
        """The poll's part: the mid-cell mirrors taken since the last poll (``{}`` when none)."""
        state = self.__dict__.get("_mirror_cadence")
        if state is None or not state["out"]:
            return {}
        with state["lock"]:
            out, state["out"] = state["out"], []
        return {"mirrors": out}

    def mirror_committed(self, point: Point) -> None:
        """The driver switched to ``point``: this rank's own takes before it go (their object store copies too)."""
        state = self._mirror_state()
        with state["lock"]:
            state["own"] = {p: ref for p, ref in state["own"].items() if p >= tuple(point)}

    def mirror_own(self, point: Point) -> Any:
        """This rank's own mid-cell mirror at ``point`` (an object ref), while it keeps it, or None."""
        state = self._mirror_state()
        with state["lock"]:
            return state["own"].get(tuple(point))

    def mirror_own_hand(self, point: Point) -> Tuple[Optional[Dict[str, Any]], bool]:
        """:meth:`mirror_own`'s mirror itself (a result the caller owns, so it outlives this worker) and whether
        there is one; the driver calls it with two results and waits for the small second one."""
        import ray  # ray: the worker runs inside it; loaded here for the ref only

        ref = self.mirror_own(point)
        mirror = ray.get(ref) if ref is not None else None
        return mirror, mirror is not None

    def mirror_hand_take(self) -> Tuple[Optional[Dict[str, Any]], bool]:
        """:meth:`mirror_take` now, and whether there is one (two results, as :meth:`mirror_own_hand`)."""
        mirror = self.mirror_take()
        return mirror, mirror is not None

    def _stepped_since_mirror(self, tracked: Any) -> bool:
        """Whether this rank's sharded optimizers stepped since its last mirror (or none was taken)."""
        return _version(tracked) != self.__dict__.get("_mirror_version")

    def _shards_stepped(self) -> bool:
        """On the cell thread at a cell's end: whether this rank holds sharded models not mirrored as they are now
        (their optimizers stepped since the last mirror, or none was taken). Free where nothing can be sharded."""
        if "torch.distributed.tensor" not in sys.modules:
            return False
        key = (shard_watch.steps_taken(), self.__dict__.get("_mirror_version"), self._cells.calls,
               shard_watch.namespace_shape(self.namespace))
        memo = self.__dict__.get("_shards_memo")
        if memo is not None and memo[0][:2] == key[:2] and memo[0][2] + 1 == key[2] and memo[0][3] == key[3]:
            self.__dict__["_shards_memo"] = (key, memo[1])  # only this cell ran since, and it changed nothing of it
            return memo[1]
        try:
            tracked = find_tracked(self.namespace, strict=False)
            stepped = bool(tracked.sharded) and self._stepped_since_mirror(tracked)
        except Exception:  # noqa: BLE001 - a look for the driver's sake: it never fails the cell
            logger.debug("could not tell whether this rank's shards changed", exc_info=True)
            return False
        self.__dict__["_shards_memo"] = (key, stepped)
        return stepped

    def mirror_is_clean(self, point: Optional[Point] = None) -> bool:
        """Whether this rank's sharded models have not trained since its last mirror (taken at ``point``, if given)."""
        if point is not None and self._mirror_state()["point"] != tuple(point):
            return False
        return self._cells.call(lambda: not self._stepped_since_mirror(find_tracked(self.namespace, strict=False)))

    def gather_full(self, name: str, rank: int) -> Optional[Dict[str, Any]]:
        """Every rank: the full state dict of the sharded module ``name`` (all-gathered); kept only on ``rank``."""
        full = self._cells.call(full_state, self.namespace[name])
        return full if self.rank == rank else None

    def mirror_keep(self, rank: int, mirror: Optional[Dict[str, Any]], point: Any = None) -> int:
        """Keep rank ``rank``'s mirror at ``point`` (replacing every older one); returns its bytes."""
        store = self._mirror_store()
        with self.__dict__["_held_lock"]:
            if mirror is None:
                store.pop(rank, None)
                return 0
            store[rank] = {point: mirror}
            if isinstance(point, tuple):
                self.__dict__.setdefault("_held_floors", {})[rank] = point
        return sharded_mirror.nbytes(mirror)

    def mirror_stage(self, rank: int, point: Point, mirror: Dict[str, Any], floor: Point) -> int:
        """Keep rank ``rank``'s mid-cell mirror at ``point`` beside its committed one (``floor``, kept; older ones
        go); a point older than what this worker keeps is ignored. Returns its bytes (-1: ignored)."""
        store = self._mirror_store()
        point, floor = tuple(point), tuple(floor)
        floors = self.__dict__.setdefault("_held_floors", {})
        with self.__dict__["_held_lock"]:
            floors[rank] = max(floors.get(rank, floor), floor)
            if point < floors[rank]:  # late: a newer point is committed (or a refresh since)
                return -1
            held = store.setdefault(rank, {})
            for old in [p for p in held if p < floors[rank]]:
                del held[old]
            held[point] = mirror
        return sharded_mirror.nbytes(mirror)

    def mirror_get(self, rank: int, point: Any = None) -> Optional[Dict[str, Any]]:
        """The mirror of rank ``rank`` at ``point`` this worker keeps, or None."""
        store = self._mirror_store()
        with self.__dict__["_held_lock"]:
            return store.get(rank, {}).get(point)

    def mirror_hand(self, rank: int, point: Any = None) -> Tuple[Optional[Dict[str, Any]], bool]:
        """:meth:`mirror_get`, and whether this worker keeps one (two results, as :meth:`mirror_own_hand`)."""
        mirror = self.mirror_get(rank, point)
        return mirror, mirror is not None

    def mirror_forget(self) -> None:
        """Drop every mirror this worker keeps for others, its own mid-cell ones, and the cadence."""
        self._mirror_store().clear()
        self.__dict__.pop("_held_floors", None)
        state = self._mirror_state()
        with state["lock"]:
            state["own"], state["out"], state["point"] = {}, [], None
        self._set_cadence(0)

    def reshard(self, mirrors: List[Any]) -> List[str]:
        """Shard this rank's sharded models again over the re-formed process group and fill them from ``mirrors``
        (a list of every old rank's mirror, or object refs to them; empty: a checkpoint is loaded next)."""
        import ray  # ray: the worker runs inside it; loaded here for the refs only

        values = list(mirrors)
        while any(isinstance(m, ray.ObjectRef) for m in values):  # a rank's own mid-cell mirror: a ref to a ref
            values = [ray.get(m) if isinstance(m, ray.ObjectRef) else m for m in values]
        return self._cells.call(self._reshard, values)

    def _holds_shards(self) -> bool:
        """Whether this rank's namespace holds sharded (FSDP2) models."""
        return "torch.distributed.tensor" in sys.modules and bool(find_tracked(self.namespace, strict=False).sharded)

    def _own_shards(self) -> Optional[Dict[str, Any]]:
        """On the cell thread, before the group re-forms over the same ranks: this rank's shards as they are now
        (a mirror of itself, no communication), or None where nothing is sharded."""
        if "torch.distributed.tensor" not in sys.modules:
            return None
        tracked = find_tracked(self.namespace, strict=False)
        if not tracked.sharded:
            return None
        places = {}
        for path, module in tracked.sharded.items():
            mesh = mesh_of(module)
            places[path] = (int(mesh.size()), int(mesh.get_coordinate()[0])) if mesh is not None else (1, 0)
        return {"mirror": sharded_mirror.take(tracked), "places": places}

    def _reshard_own(self, own: Dict[str, Any]) -> List[str]:
        """After re-forming over the same ranks: shard this rank's sharded models again over the new group and
        fill them from ``own`` (:meth:`_own_shards`); the values are unchanged, so the buddies' mirrors still hold
        them and whether the shards stepped since their mirror stays as it was."""
        import torch.distributed as dist  # torch.distributed: loaded only for sharded models

        here = (dist.get_world_size(), dist.get_rank())
        for path, place in own["places"].items():
            if tuple(place) != here:  # its own shards would not be the ones this rank holds now
                raise RecoveryError(f"rank {self.rank}: {path!r} was sharded as rank {place[1]} of {place[0]}, not "
                                    f"rank {here[1]} of {here[0]} as the group re-formed, so its own shards do not "
                                    "fit: restart from a snapshot (%dist_restart --from-checkpoint NAME)")
        version = self.__dict__.get("_mirror_version")
        done = self._reshard([own["mirror"]])
        self.__dict__["_mirror_version"] = version
        return done

    def _reshard(self, mirrors: List[Dict[str, Any]]) -> List[str]:
        tracked = find_tracked(self.namespace, strict=False)
        sharded_io.forget_group()  # the DCP group of the old process group is gone with it
        from .torch_utils import get_device  # torch: the driver imports this module, and never needs torch

        done = sharded_mirror.reshard(tracked, mirrors, get_device())
        self.__dict__["_mirror_version"] = None
        return done
