"""The worker's part in keeping sharded models whole: mirrors of its shards, a buddy's mirrors, re-sharding.

Each rank takes a mirror of its own shards (:func:`.sharded_mirror.take`) when the driver asks; the driver hands it
to the rank's buddy, which keeps it in its memory (:meth:`MirroringWorker.mirror_keep`). After the process group
re-forms, every rank re-shards its sharded modules in place from the mirrors (:meth:`MirroringWorker.reshard`).
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Dict, List, Optional

from ..errors import RecoveryError
from . import sharded_io, sharded_mirror
from .sharded import ShardedPull, full_state, is_sharded, local_share
from .snapshot import find_tracked

logger = logging.getLogger(__name__)


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

    def _mirror_store(self) -> Dict[int, Any]:
        store = self.__dict__.get("_held_mirrors")
        if store is None:
            store = self.__dict__["_held_mirrors"] = {}
        return store

    def sharded_share(self) -> Optional[Dict[str, Any]]:
        """This rank's share of its sharded models (strategy, mesh size, bytes here and in all), or None."""
        return self._cells.call(lambda: sharded_io.share(find_tracked(self.namespace, strict=False)))

    def mirror_take(self, require_clean: bool = False) -> Optional[Dict[str, Any]]:
        """A mirror of this rank's shards now, or None without sharded models.

        Raises:
            RecoveryError: with ``require_clean``, this rank trained since its last mirror (then a fresh mirror
                would not match the others' mirror point).
        """
        if "torch.distributed.tensor" not in sys.modules:  # nothing can be sharded: no walk, no cell-thread call
            return None
        return self._cells.call(self._take_mirror, require_clean)

    def _take_mirror(self, require_clean: bool) -> Optional[Dict[str, Any]]:
        tracked = find_tracked(self.namespace, strict=False)
        if not tracked.sharded:
            return None
        if require_clean and self._stepped_since_mirror(tracked):
            raise RecoveryError(f"rank {self.rank} trained since its last mirror and its mirror is gone with its "
                                "buddy, so no consistent copy of every rank's shards is left: restart from a "
                                "snapshot (%dist_restart --from-checkpoint NAME)")
        self.__dict__["_mirror_version"] = _version(tracked)
        return sharded_mirror.take(tracked)

    def _stepped_since_mirror(self, tracked: Any) -> bool:
        """Whether this rank's sharded optimizers stepped since its last mirror (or none was taken)."""
        return _version(tracked) != self.__dict__.get("_mirror_version")

    def _shards_stepped(self) -> bool:
        """On the cell thread at a cell's end: whether this rank holds sharded models not mirrored as they are now
        (their optimizers stepped since the last mirror, or none was taken). Free where nothing can be sharded."""
        if "torch.distributed.tensor" not in sys.modules:
            return False
        try:
            tracked = find_tracked(self.namespace, strict=False)
            return bool(tracked.sharded) and self._stepped_since_mirror(tracked)
        except Exception:  # noqa: BLE001 - a look for the driver's sake: it never fails the cell
            logger.debug("could not tell whether this rank's shards changed", exc_info=True)
            return False

    def mirror_is_clean(self) -> bool:
        """Whether this rank's sharded models have not trained since its last mirror."""
        return self._cells.call(lambda: not self._stepped_since_mirror(find_tracked(self.namespace, strict=False)))

    def gather_full(self, name: str, rank: int) -> Optional[Dict[str, Any]]:
        """Every rank: the full state dict of the sharded module ``name`` (all-gathered); kept only on ``rank``."""
        full = self._cells.call(full_state, self.namespace[name])
        return full if self.rank == rank else None

    def mirror_keep(self, rank: int, mirror: Optional[Dict[str, Any]]) -> int:
        """Keep rank ``rank``'s mirror (replacing its older one); returns its bytes."""
        store = self._mirror_store()
        if mirror is None:
            store.pop(rank, None)
            return 0
        store[rank] = mirror
        return sharded_mirror.nbytes(mirror)

    def mirror_get(self, rank: int) -> Optional[Dict[str, Any]]:
        """The mirror of rank ``rank`` this worker keeps, or None."""
        return self._mirror_store().get(rank)

    def mirror_forget(self) -> None:
        """Drop every mirror this worker keeps for others."""
        self._mirror_store().clear()

    def reshard(self, mirrors: List[Any]) -> List[str]:
        """Shard this rank's sharded models again over the re-formed process group and fill them from ``mirrors``
        (a list of every old rank's mirror, or object refs to them; empty: a checkpoint is loaded next)."""
        import ray  # ray: the worker runs inside it; loaded here for the refs only

        values = [ray.get(m) if isinstance(m, ray.ObjectRef) else m for m in mirrors]
        return self._cells.call(self._reshard, values)

    def _reshard(self, mirrors: List[Dict[str, Any]]) -> List[str]:
        tracked = find_tracked(self.namespace, strict=False)
        sharded_io.forget_group()  # the DCP group of the old process group is gone with it
        from .torch_utils import get_device  # torch: the driver imports this module, and never needs torch

        done = sharded_mirror.reshard(tracked, mirrors, get_device())
        self.__dict__["_mirror_version"] = None
        return done
