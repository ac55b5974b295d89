"""How a worker joins its group: rank variables, the process group, replaying cells, state from a peer."""
from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..backend import deferred_ddp, free_port
from . import accelerate_guard
from . import cell as cellmod
from . import peer_copy, rank_values, snapshot
from .library_state import library_env, reset_library_state
from .replicate import sync_replicated
from .session import TrainContext, WorkerSession, dataset_shards, set_session


class FormingWorker:
    """Setting up, joining and re-joining the process group (a part of :class:`~.actor.Worker`)."""

    namespace: Dict[str, Any]
    rank: int
    session: Any
    pg: Any
    _cells: Any
    _join_epoch: int
    _own_shards: Any
    _holds_shards: Any
    _reshard_own: Any

    def free_port(self) -> int:
        return free_port()

    def open_store(self, master_addr: str, world_size: int) -> int:
        """Start the process group's rendezvous server on this (rank 0) worker; returns its port."""
        return self._cells.call(self.pg.open_store, master_addr, world_size)

    def setup(self, context: Dict[str, Any], env: Dict[str, str], backend: str,
              master_addr: str, master_port: int, defer: bool = False) -> Dict[str, Any]:
        """Set rank variables, then join the process group (on the cell thread).

        With ``defer`` the process group is joined later (:meth:`join`), after
        the worker replayed the group's setup cells.
        """
        return self._cells.call(self._setup, context, env, backend, master_addr, master_port, defer)

    def _setup(self, context: Dict[str, Any], env: Dict[str, str], backend: str,
               master_addr: str, master_port: int, defer: bool) -> Dict[str, Any]:
        self._set_context(context, env)
        device = "cpu"
        self.pg.backend = backend
        if backend != "none":
            import torch  # torch: loaded on first use, not on import raytrain_nb

            if torch.cuda.is_available() and os.environ.get("CUDA_VISIBLE_DEVICES", "") not in ("", "-1"):
                torch.cuda.set_device(0)
                device = f"cuda:{torch.cuda.current_device()} ({torch.cuda.get_device_name()})"
            os.environ.update(library_env(backend, cuda=device != "cpu"))  # Accelerate: use this group
            accelerate_guard.install(cpu=device == "cpu")  # its FSDP / DeepSpeed plugins: refused on CPU
            if defer:
                self.pg.deferred = True
            else:
                self.pg.init(backend, master_addr, master_port, self.rank, context["world_size"])
        return {"device": device, "preload_s": self.preload_s}

    def _set_context(self, context: Dict[str, Any], env: Dict[str, str]) -> None:
        for key, value in env.items():  # an empty value removes the variable
            if value:
                os.environ[key] = value
            else:
                os.environ.pop(key, None)
        ctx = TrainContext(**context)
        self.rank = ctx.world_rank
        if self.session is None:
            self.session = WorkerSession(ctx)
        else:
            self.session.context = ctx
        set_session(self.session)
        self._attach_session()
        reset_library_state(ctx)  # Accelerate, Transformers...: their caches hold the old rank and size

    def leave_group(self, epoch: int) -> bool:
        """Leave this rank's process group now, ahead of the join of recovery ``epoch`` (a survivor's group, broken
        by a dead peer, is left while the new ranks start and replay, not inside the join: 50-90 ms at 16 ranks).
        Runs on the cell thread, in order with the join; a join of this recovery that came first left the group
        itself, and this does nothing then. Returns whether it left a group."""
        return self._cells.call(self._leave_group, epoch)

    def _leave_group(self, epoch: int) -> bool:
        if epoch <= self._join_epoch:  # this recovery's join arrived before: the group is the new one (formed or
            return False  # forming), and stays
        active = self.pg.active
        self.pg.destroy()
        return active

    def join(self, context: Dict[str, Any], env: Dict[str, str], master_addr: str, master_port: int,
             src: int = 0, fresh: bool = False, rank_specific: Sequence[str] = (),
             keep_shards: bool = False, keep_group: bool = False, some_fresh: bool = False,
             epoch: int = 0) -> Dict[str, Any]:
        """(Re-)form the process group at the given rank and size; sync state from rank ``src``.

        ``keep_shards``: the group re-forms over the same ranks (after an interrupt or a broken collective), so
        this rank's sharded models are sharded again over the new group from their own shards as they are.
        ``keep_group``: every rank keeps the process group it is in (intact after an interrupt: the driver saw
        every rank's collective counts alike), and only brings its state in line over it; a rank whose group
        was broken since raises, and the driver re-forms. ``some_fresh``: the driver sends some rank what it lacks
        (every rank is told alike), so the ranks' inventories differ and are gathered whole at once. ``epoch``: the
        recovery this join belongs to (its :meth:`leave_group`, if it comes later, does nothing).

        Returns ``{"rebound": DDP wrappers re-bound, "missing": names this fresh rank went without,
        "received": names it got from rank src, "resharded": sharded models and optimizers moved to the new group,
        "phases": seconds in each step of joining}``.
        """
        self._join_epoch = max(self._join_epoch, epoch)  # on arrival, before the cell thread runs anything after
        return self._cells.call(self._join, context, env, master_addr, master_port, src, fresh, rank_specific,
                                keep_shards, keep_group, some_fresh)

    def _join(self, context: Dict[str, Any], env: Dict[str, str], master_addr: str, master_port: int,
              src: int, fresh: bool, rank_specific: Sequence[str], keep_shards: bool,
              keep_group: bool, some_fresh: bool) -> Dict[str, Any]:
        # taken while the old mesh is there (a kept group keeps its mesh, and the shards on it)
        own = self._own_shards() if keep_shards and not fresh and not keep_group else None
        self._set_context(context, env)
        out: Dict[str, Any] = {"missing": [], "received": [], "resharded": []}

        def sync() -> List[Any]:
            wrappers, out["missing"], out["received"] = sync_replicated(
                self.namespace, src=src, fresh=fresh, rank_specific=rank_specific, shards=dataset_shards(),
                deferred_ddp=self._deferred_ddp, alike=not some_fresh)
            return wrappers

        if keep_group:
            out["rebound"] = self.pg.resync(sync=sync)
        else:
            out["rebound"] = self.pg.join(self.pg.backend, master_addr, master_port, self.rank,
                                          context["world_size"], sync=sync)
        if own is not None:  # FSDP2 modules still point at the old group, which is gone
            out["resharded"] = self._reshard_own(own)
        out["phases"] = dict(self.pg.join_phases)
        return out

    def _kept_group_sequence(self) -> Optional[List[int]]:
        """At a cell's end: after an interrupt, this rank's collective counts (``ProcessGroupState.sequence``), by
        which the driver sees whether the group may be kept; None otherwise, and where sharded models are held
        (they re-shard on a new group)."""
        return self.pg.sequence() if self._interrupted and not self._holds_shards() else None

    def refresh_rank_values(self, statements: Sequence[str], names: Sequence[str]) -> Dict[str, Any]:
        """After joining (the new context set): run again the notebook's assignments of rank values
        (:func:`.rank_values.plan_rank_values`'s) on the cell thread and keep ``names``.

        Returns ``{"set": names set, "failed": {name: "Type: message"}}``."""
        return self._cells.call(rank_values.reevaluate, self.namespace, statements, names)

    # -- a peer's state through the driver, where no torch process group carries it (peer_copy.py) -------------

    def peer_inventory(self, fresh: bool) -> Dict[str, Any]:
        """What this rank holds, for the driver to plan what new ranks get from a live peer."""
        return self._cells.call(peer_copy.inventory, self.namespace, fresh)

    def peer_pack(self, send: Sequence[str], keep: Sequence[str], plain: Sequence[str],
                  models: Sequence[str]) -> Dict[str, Any]:
        """On the source rank: what the new ranks need (:func:`.peer_copy.pack`)."""
        return self._cells.call(peer_copy.pack, self.namespace, send, keep, plain, models, dataset_shards())

    def peer_receive(self, packed: Dict[str, Any], keep: Sequence[str]) -> List[str]:
        """On a new rank: load the source rank's packed state; the names received."""
        return self._cells.call(peer_copy.receive, self.namespace, packed, keep, dataset_shards(), self._deferred_ddp)

    def _deferred_ddp(self, module: Any, kwargs: Dict[str, Any]) -> Any:
        wrapper = deferred_ddp(module, kwargs)
        self.pg.track(wrapper)
        return wrapper

    def replay(self, cells: Sequence[Tuple[int, str, bool]], framework: Optional[Any] = None) -> List[str]:
        """Rebuild a new worker's namespace (collectives deferred): setup cells (``full``) run again; of the
        other cells only the imports, functions and classes. Returns the failures, one line each.

        ``framework``: ``(backend, spec)`` the cells run inside, when every rank replays together in fresh
        processes (TensorFlow's strategy, made in a setup cell, then spans the new processes)."""
        failed = []
        for cell_id, source, full in cells:
            source = source if full else cellmod.definitions(source)
            if not source:
                continue
            failure = self._cells.call(self._run_cell, source, cell_id, False, 0, False, framework).failure
            if failure is not None:
                failed.append(f"cell {cell_id}: {failure.type_name}: {failure.message}")
        return failed

    def carry_state(self) -> bytes:
        """The tracked objects' state (models, optimizers, boosters, Keras models), to load into fresh processes
        that replace every rank (:meth:`load_carried`)."""
        return self._cells.call(lambda: snapshot.dumps(snapshot.capture(self.namespace, copy=False)[0]))

    def load_carried(self, data: bytes) -> Dict[str, List[str]]:
        """Load :meth:`carry_state`'s bytes into this fresh rank's replayed objects of the same names.

        Returns ``{"restored": names, "missing": names no replayed cell made}``."""
        return self._cells.call(self._load_carried, data)

    def _load_carried(self, data: bytes) -> Dict[str, List[str]]:
        state = snapshot.loads(data, "the state carried from a live rank", may_pickle=False)
        tracked = set(snapshot.find_tracked(self.namespace, strict=False).names())
        missing = sorted(n for kind in snapshot.KINDS for n in state.get(kind, {}) if n not in tracked)
        present = {kind: {n: v for n, v in state.get(kind, {}).items() if n in tracked} for kind in snapshot.KINDS}
        restored = snapshot.restore(self.namespace, present, None, {}, action="load the carried state into")
        return {"restored": restored, "missing": missing}

