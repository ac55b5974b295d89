"""Process groups on a worker: form, break, re-form, and re-wrap DDP models in place.

One mechanism serves an interrupt that left a rank blocked in a collective, a
peer that raised while others waited, rescale and worker replacement: the
group's own TCP sockets are shut down (so every peer blocked on them fails at
once), a new process group is formed on a new port, and each DDP wrapper made
by ``prepare_model`` is rebuilt around the same module and swapped into the
same Python object (``id(model)`` does not change).
"""
from __future__ import annotations

import datetime
import logging
import math
import socket
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

from .sockets import inet_socket_fds, opened_between, shutdown_sockets

logger = logging.getLogger(__name__)

SUPPORTED_BACKENDS = ("gloo", "nccl", "none")
#: How long forming a process group may take on a worker (the rendezvous and gloo's connections): a rank
#: left waiting for a peer that died mid-formation gives up by then, so its cell thread is free again.
FORM_TIMEOUT_S = 30.0
#: The phase a rank reports while it forms the process group (see ``ProcessGroupState.phase``).
FORMING = "forming the process group"


def _reset_group_names(dist: Any) -> None:
    """Name the next default process group as a fresh process would.

    torch names a default group by a per-process counter, which destroying the group resets, but an
    ``init_process_group`` that failed midway does not: the process would then name its next group
    "1" while a new rank names it "0", and their rendezvous keys would never meet (gloo waits for
    peers' addresses under the other name until its timeout).
    """
    world = getattr(dist.distributed_c10d, "_world", None)
    if world is not None and not dist.is_initialized() and getattr(world, "group_count", 0):
        world.group_count = 0


class ProcessGroupState:
    """The torch.distributed state of one worker process."""

    def __init__(self) -> None:
        self.backend = "none"
        self.rank = 0
        self.world_size = 1
        self._sockets: Dict[int, str] = {}
        self.broken = False
        self._lock = threading.Lock()
        self._wrappers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self._samplers: "weakref.WeakSet[Any]" = weakref.WeakSet()
        self.generation = 0
        self.deferred = False  # True while a new rank replays setup cells before joining
        self.forwards = 0  # forward passes of prepared models (a cell with any is not a setup cell)
        self._master_store: Any = None
        self.phase = ""  # the step of (re-)forming this rank is in, for the driver's liveness check
        #: Seconds the last :meth:`join` spent in each step (leave, form, sync, rebind, barrier), for the bench.
        self.join_phases: Dict[str, float] = {}
        self._forming_port: Optional[int] = None  # the rendezvous port while init_process_group runs

    @property
    def active(self) -> bool:
        if self.backend == "none":
            return False
        import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

        return dist.is_available() and dist.is_initialized()

    def init(self, backend: str, master_addr: str, master_port: int, rank: int, world_size: int,
             timeout_s: float = 1800.0) -> None:
        """Join a new process group; remember the TCP sockets it opened."""
        self.backend = backend
        self.rank = rank
        self.world_size = world_size
        if backend == "none":
            return
        import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

        before = inet_socket_fds()
        with self._lock:
            self._forming_port = master_port
        timeout = datetime.timedelta(seconds=timeout_s)
        set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
        # Form under a short deadline, then give collectives the long one (when torch lets us change it).
        form = datetime.timedelta(seconds=min(timeout_s, FORM_TIMEOUT_S)) if set_timeout else timeout
        _reset_group_names(dist)
        store, self._master_store = self._master_store, None
        if store is None:  # rank 0 opened the rendezvous server (open_store) before the others came
            from torch.distributed import TCPStore  # torch: loaded on first use, not on import raytrain_nb

            store = TCPStore(master_addr, master_port, world_size, is_master=False, timeout=form)
        try:
            dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, timeout=form)
            if set_timeout is not None:
                store.set_timeout(timeout)
                set_timeout(timeout)
        finally:
            with self._lock:
                self._forming_port = None
        with self._lock:
            self._sockets = opened_between(before, inet_socket_fds())
            self.broken = False
            self.generation += 1
        logger.debug("rank %d joined %s group (%d sockets)", rank, backend, len(self._sockets))

    def open_group(self, make: Callable[[], Any]) -> Any:
        """Call ``make()`` (it forms another group over this one's ranks: ``dist.new_group``) and count the TCP
        sockets it opened as this group's, so that breaking this group (a dead peer, an interrupt, re-forming)
        releases a collective waiting on that group too."""
        before = inet_socket_fds()
        group = make()
        with self._lock:
            self._sockets.update(opened_between(before, inet_socket_fds()))
        return group

    def set_timeout(self, timeout_s: float) -> None:
        """Give this process's group's collectives ``timeout_s`` seconds (``TorchConfig(timeout_s=...)``), where
        torch lets a formed group's timeout change; no group: nothing."""
        if not self.active:
            return
        import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

        set_timeout = getattr(dist.distributed_c10d, "_set_pg_timeout", None)
        if set_timeout is None:
            raise RuntimeError(f"TorchConfig(timeout_s={timeout_s}): this torch cannot change a formed process "
                               "group's timeout; use the default 1800")
        set_timeout(datetime.timedelta(seconds=timeout_s))

    def open_store(self, master_addr: str, world_size: int, timeout_s: float = FORM_TIMEOUT_S) -> int:
        """On rank 0: start the rendezvous server now, so the other ranks connect at once
        (a client that comes before the server backs off for hundreds of ms). Returns its port."""
        from torch.distributed import TCPStore  # torch: loaded on first use, not on import raytrain_nb

        # Listen on exactly ``master_addr`` (loopback for a one-machine group), not on every interface.
        listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        listener.bind((master_addr, 0))
        listener.listen(max(128, world_size))
        try:
            self._master_store = TCPStore(master_addr, listener.getsockname()[1], world_size, is_master=True,
                                          wait_for_workers=False, master_listen_fd=listener.fileno(),
                                          timeout=datetime.timedelta(seconds=timeout_s))
        finally:
            listener.detach()  # the store owns the socket now
        return self._master_store.port

    def break_(self) -> bool:
        """Make every collective of this group fail at once, here and on every peer.

        Shuts down (does not close) the group's own TCP sockets; for nccl also
        aborts the communicators. Returns True if anything was broken.
        """
        with self._lock:
            if self._forming_port is not None:  # still forming: end the rendezvous, so init fails at once
                shutdown_sockets(inet_socket_fds(established_only=True, port=self._forming_port))
                return True
            if self.broken or self.backend == "none":
                return False
            self.broken = True
            # Connected sockets only: shutting down gloo's listener aborts the process.
            current = inet_socket_fds(established_only=True)
            shutdown_sockets({fd: inode for fd, inode in self._sockets.items() if current.get(fd) == inode})
        if self.backend == "nccl":
            try:
                import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

                abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
                if abort is not None and dist.is_initialized():  # (none: its group is already gone)
                    abort()
            except Exception as exc:  # pragma: no cover - GPU only
                logger.warning("nccl abort failed: %s", exc)
        return True

    def destroy(self) -> None:
        """Leave the process group (after breaking it, so nothing blocks)."""
        if self.backend == "none":
            return
        import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

        self.break_()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:
                logger.debug("destroy_process_group: %s", exc)
        with self._lock:
            self._sockets = {}

    def join(self, backend: str, master_addr: str, master_port: int, rank: int, world_size: int,
             sync: Optional[Callable[[], Sequence[Any]]] = None) -> int:
        """Leave any old process group, form the new one, and bring this rank's state in line.

        After the group forms, ``sync()`` runs (the worker brings its replicated state in line with a
        source rank there) and returns the DDP wrappers to re-bind, in an order every rank agreed on;
        without ``sync``, every wrapper made by ``prepare_model`` is. Samplers made by
        ``prepare_data_loader`` are re-sharded for the new world size. Returns the number of DDP
        wrappers re-bound.
        """
        lap = self._start_laps()
        self.destroy()
        self.deferred = False
        lap("leave")
        try:
            self.phase = FORMING
            self.init(backend, master_addr, master_port, rank, world_size)
            lap("form")
            if backend == "none":
                return 0
            return self._bring_in_line(rank, world_size, sync, lap)
        finally:
            self.phase = ""

    def resync(self, sync: Optional[Callable[[], Sequence[Any]]] = None) -> int:
        """:meth:`join`'s steps after forming, over the process group this rank is in: every rank kept the same
        intact group (an interrupt that stopped no rank inside a collective: :meth:`sequence` alike on every
        rank), so leaving it and forming a new one would only cost time. Returns the DDP wrappers re-bound.

        Raises:
            RuntimeError: this rank has no process group, or it was broken since (then the group re-forms).
        """
        if not self.active or self.broken:
            raise RuntimeError(f"rank {self.rank}'s process group was broken or left since the cell: it re-forms")
        lap = self._start_laps()
        self.deferred = False
        try:
            return self._bring_in_line(self.rank, self.world_size, sync, lap)
        finally:
            self.phase = ""

    def _start_laps(self) -> Callable[[str], None]:
        """A fresh :attr:`join_phases`, and ``lap(name)``, which stores there the seconds since the previous lap."""
        laps: Dict[str, float] = {}
        self.join_phases = laps
        mark = [time.perf_counter()]

        def lap(name: str) -> None:
            now = time.perf_counter()
            laps[name], mark[0] = now - mark[0], now

        return lap

    def _bring_in_line(self, rank: int, world_size: int, sync: Optional[Callable[[], Sequence[Any]]],
                       lap: Callable[[str], None]) -> int:
        self.phase = "bringing state in line"
        wrappers = list(sync()) if sync is not None else list(self._wrappers)
        self.reshard(rank, world_size)
        lap("sync")
        self.phase = "re-binding DDP models"
        for wrapper in wrappers:
            rebind_ddp(wrapper)
        lap("rebind")
        self.phase = "finishing"
        import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

        dist.barrier()  # every rank leaves the step together: one still in it is a protocol error
        lap("barrier")
        return len(wrappers)

    def sequence(self) -> Optional[List[int]]:
        """How many collectives this rank has issued on each of its process groups (the default group first,
        then every group made over it, in the order they were made); None without an intact gloo group.

        Every rank with the same numbers, none broken, issued the same collectives, and each returned from
        them (an interrupt stops Python code only, not a call inside torch): no collective is half done, so
        after an interrupt the group can be kept (:meth:`resync`). Other backends re-form as before."""
        if self.backend != "gloo" or self.broken:
            return None
        try:
            import torch.distributed as dist  # torch: loaded on first use, not on import raytrain_nb

            if not dist.is_initialized():
                return None
            groups = list(dist.distributed_c10d._world.pg_map)  # creation order; the default group first
            return [int(g._get_sequence_number_for_group()) for g in groups]
        except Exception as exc:  # noqa: BLE001 - a torch without the counters: re-form, as before
            logger.debug("no collective sequence numbers: %s", exc)
            return None

    # -- objects made by prepare_model / prepare_data_loader -------------------------------

    def forget_tracked(self) -> None:
        """Stop tracking every DDP wrapper and sampler made so far (they will not be re-bound)."""
        self._wrappers = weakref.WeakSet()
        self._samplers = weakref.WeakSet()

    def track(self, wrapper: Any) -> None:
        self._wrappers.add(wrapper)

    def track_sampler(self, sampler: Any) -> None:
        self._samplers.add(sampler)

    def adopt_samplers(self, values: Iterable[Any]) -> int:
        """Track the ``DistributedSampler`` of each loader in ``values`` (objects a new rank received from a
        peer: their samplers still point at the peer's shard), so joining re-shards them for this rank.
        Returns how many it found."""
        from torch.utils.data import DistributedSampler  # torch: loaded on first use, not on import raytrain_nb

        found = 0
        for value in values:
            for holder in (value, getattr(value, "loader", None)):  # a DataLoader, or one moved to the device
                sampler = getattr(holder, "sampler", None)
                if isinstance(sampler, DistributedSampler):
                    self.track_sampler(sampler)
                    found += 1
        return found

    def reshard(self, rank: int, world_size: int) -> None:
        """Point every tracked DistributedSampler at this rank's shard of the new world."""
        for sampler in list(self._samplers):
            reshard_sampler(sampler, rank, world_size)


def reshard_sampler(sampler: Any, rank: int, world_size: int) -> None:
    """Change a ``DistributedSampler``'s rank and number of replicas in place."""

    n = len(sampler.dataset)
    sampler.num_replicas = world_size
    sampler.rank = rank
    if sampler.drop_last and n % world_size != 0:
        sampler.num_samples = math.ceil((n - world_size) / world_size)
    else:
        sampler.num_samples = math.ceil(n / world_size)
    sampler.total_size = sampler.num_samples * world_size


def deferred_ddp(module: Any, kwargs: Dict[str, Any]) -> Any:
    """A DDP object not yet bound to a process group (a new rank replaying setup cells).

    ``parameters()`` and ``.module`` work; it becomes a real DDP wrapper, the
    same object, when the group forms.
    """
    import torch  # torch: loaded on first use, not on import raytrain_nb
    from torch.nn.parallel import DistributedDataParallel as DDP  # torch: as above

    shell = DDP.__new__(DDP)
    torch.nn.Module.__init__(shell)
    shell.module = module
    shell._rtnb_ddp_kwargs = dict(kwargs)
    return shell


def rebind_ddp(wrapper: Any) -> None:
    """Rebuild a DDP wrapper on the current default process group, in place.

    The wrapped module is untouched; the new wrapper's state replaces the old
    one's, so references the user holds stay valid. DDP's constructor
    broadcasts parameters and buffers from rank 0, so all ranks agree again.
    """
    # torch: loaded on first use, not on import raytrain_nb
    from torch.nn.parallel import DistributedDataParallel as DDP

    kwargs = dict(getattr(wrapper, "_rtnb_ddp_kwargs", {}))
    fresh = DDP(wrapper.module, **kwargs)  # broadcasts parameters and buffers from rank 0
    state = fresh.__dict__
    fresh.__dict__ = {}
    wrapper.__dict__.clear()
    wrapper.__dict__.update(state)
    wrapper._rtnb_ddp_kwargs = kwargs


_STATE: Optional[ProcessGroupState] = None


def process_group_state() -> ProcessGroupState:
    """This process's :class:`ProcessGroupState` (one per worker process)."""
    global _STATE
    if _STATE is None:
        _STATE = ProcessGroupState()
    return _STATE


def free_port() -> int:
    """A TCP port free on this node now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return s.getsockname()[1]
