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
import os
import socket
import threading
import weakref
from typing import Any, Dict, List, Optional, Set, Tuple

logger = logging.getLogger(__name__)

SUPPORTED_BACKENDS = ("gloo", "nccl", "none")


_ESTABLISHED = "01"


def _inet_inodes(established_only: bool = False) -> Set[str]:
    inodes: Set[str] = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as fh:
                next(fh, None)
                for line in fh:
                    parts = line.split()
                    if len(parts) > 9 and (not established_only or parts[3] == _ESTABLISHED):
                        inodes.add(parts[9])
        except OSError:
            continue
    return inodes


def inet_socket_fds(established_only: bool = False) -> Dict[int, str]:
    """Map fd -> socket inode for this process's TCP sockets (listening ones too unless asked)."""
    inet = _inet_inodes(established_only)
    out: Dict[int, str] = {}
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in names:
        try:
            target = os.readlink(f"/proc/self/fd/{name}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inode = target[8:-1]
            if inode in inet:
                out[int(name)] = inode
    return out


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
        self.generation = 0

    @property
    def active(self) -> bool:
        if self.backend == "none":
            return False
        import torch.distributed as dist

        return dist.is_available() and dist.is_initialized()

    def init(self, backend: str, master_addr: str, master_port: int, rank: int, world_size: int,
             timeout_s: float = 1800.0) -> None:
        """Join a new process group; remember the TCP sockets it opened."""
        self.backend = backend
        self.rank = rank
        self.world_size = world_size
        if backend == "none":
            return
        import torch.distributed as dist

        before = inet_socket_fds()
        dist.init_process_group(
            backend=backend,
            init_method=f"tcp://{master_addr}:{master_port}",
            rank=rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        after = inet_socket_fds()
        with self._lock:
            self._sockets = {fd: ino for fd, ino in after.items() if before.get(fd) != ino}
            self.broken = False
            self.generation += 1
        logger.debug("rank %d joined %s group (%d sockets)", rank, backend, len(self._sockets))

    def break_(self) -> bool:
        """Make every collective of this group fail at once, here and on every peer.

        Shuts down (does not close) the group's own TCP sockets; for nccl also
        aborts the communicators. Returns True if anything was broken.
        """
        with self._lock:
            if self.broken or self.backend == "none":
                return False
            self.broken = True
            # Connected sockets only: shutting down gloo's listener aborts the process.
            current = inet_socket_fds(established_only=True)
            for fd, inode in self._sockets.items():
                if current.get(fd) != inode:
                    continue  # closed or reused since: not ours any more
                try:
                    sock = socket.socket(fileno=fd)
                except OSError:
                    continue
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
                finally:
                    sock.detach()
        if self.backend == "nccl":
            try:
                import torch.distributed as dist

                abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
                if abort is not None:
                    abort()
            except Exception as exc:  # pragma: no cover - GPU only
                logger.warning("nccl abort failed: %s", exc)
        return True

    def destroy(self) -> None:
        """Leave the process group (after breaking it, so nothing blocks)."""
        if self.backend == "none":
            return
        import torch.distributed as dist

        self.break_()
        if dist.is_initialized():
            try:
                dist.destroy_process_group()
            except Exception as exc:
                logger.debug("destroy_process_group: %s", exc)
        with self._lock:
            self._sockets = {}

    def reform(self, master_addr: str, master_port: int, rank: int, world_size: int,
               namespace: Optional[Dict[str, Any]] = None) -> int:
        """Replace the process group with a new one; re-wrap tracked DDP models.

        DDP's constructor broadcasts parameters and buffers from rank 0; the
        optimizers and LR schedulers of those models found in ``namespace``
        get rank 0's state too, so ranks interrupted at different points of a
        step agree again. Returns the number of DDP wrappers re-bound.
        """
        backend = self.backend
        self.destroy()
        self.init(backend, master_addr, master_port, rank, world_size)
        n = self.rewrap_all()
        if n and namespace is not None:
            sync_optimizers(namespace, list(self._wrappers))
        return n

    # -- DDP wrappers made by prepare_model ---------------------------------------------

    def track(self, wrapper: Any) -> None:
        self._wrappers.add(wrapper)

    def rewrap_all(self) -> int:
        n = 0
        for wrapper in list(self._wrappers):
            rebind_ddp(wrapper)
            n += 1
        return n


def rebind_ddp(wrapper: Any) -> None:
    """Rebuild a DDP wrapper on the current default process group, in place.

    The wrapped module is untouched; the new wrapper's state replaces the old
    one's, so references the user holds stay valid. DDP's constructor
    broadcasts parameters and buffers from rank 0, so all ranks agree again.
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    kwargs = dict(getattr(wrapper, "_rtnb_ddp_kwargs", {}))
    fresh = DDP(wrapper.module, **kwargs)
    state = fresh.__dict__
    fresh.__dict__ = {}
    wrapper.__dict__.clear()
    wrapper.__dict__.update(state)
    wrapper._rtnb_ddp_kwargs = kwargs


def sync_optimizers(namespace: Dict[str, Any], wrappers: List[Any]) -> int:
    """Give every rank rank 0's optimizer and LR-scheduler state for the wrapped models.

    Every rank finds the same names (the namespaces are replicated), so the
    broadcasts line up. Returns the number of objects synchronised.
    """
    import torch
    import torch.distributed as dist

    params = {id(p) for w in wrappers for p in w.module.parameters()}
    names_sorted = sorted(k for k in namespace if not k.startswith("_"))
    found: List[Tuple[str, Any]] = [
        (name, namespace[name]) for name in names_sorted
        if isinstance(namespace[name], torch.optim.Optimizer)
        and any(id(p) in params for g in namespace[name].param_groups for p in g["params"])
    ]
    optimizers = [o for _, o in found]
    found += [
        (name, namespace[name]) for name in names_sorted
        if isinstance(namespace[name], torch.optim.lr_scheduler.LRScheduler)
        and any(namespace[name].optimizer is o for o in optimizers)
    ]
    names = [name for name, _ in found]
    agreed = [None] * dist.get_world_size()
    dist.all_gather_object(agreed, names)
    if any(a != names for a in agreed):
        logger.warning("optimizer names differ across ranks; optimizer state not synchronised")
        return 0
    for _, obj in found:
        box = [obj.state_dict() if dist.get_rank() == 0 else None]
        dist.broadcast_object_list(box, src=0)
        if dist.get_rank() != 0:
            obj.load_state_dict(box[0])
    return len(found)


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
