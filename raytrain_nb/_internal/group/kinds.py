"""Group kinds: how a group forms, carries state to new ranks and recovers, chosen once from its config.

Three kinds cover every backend:

- :class:`TorchProcessGroup` (``gloo``, ``nccl``): the ranks form a ``torch.distributed`` process group; a
  new rank gets what it lacks from a live peer inside it (``worker/replicate.py``); a cell that broke the
  process group (a rank raised in a collective, an interrupt) has it re-formed on the same workers.
- :class:`PeersThroughDriver` (``none``, ``xgboost``, ``lightgbm``): no torch process group; a new rank
  gets a live peer's state through the driver (``group/peer_state.py``); a library's collective, if any, is
  set up around each cell (``worker/framework.py``).
- :class:`FreshProcesses` (``tensorflow``): the library cannot form its collective again in a live process,
  so a restart or rescale replaces every rank, the lowest live rank's state carried through the driver.

Every question that used to be a string check of the backend is a question to the group's kind. A new
backend is one :class:`~raytrain_nb._internal.worker.framework.FrameworkBackend` registered by name (its
kind follows from ``fresh_processes``), or one kind class added to :data:`TORCH_BACKENDS` /
:func:`kind_for`; :func:`backend_names` is what ``WorkerGroup(backend=...)`` and ``--backend`` accept.
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional, Sequence, Tuple

from ..worker import framework as frameworks
from ..worker.framework import FrameworkBackend

#: The torch backends (``none``: no process group), in the order ``--backend`` lists them.
TORCH_BACKENDS: Tuple[str, ...] = ("gloo", "nccl", "none")


class GroupKind:
    """What a group of this kind does; subclasses set the class attributes.

    Attributes:
        name: what ``WorkerGroup(backend=...)`` took (``gloo``, ``xgboost``...).
        torch_backend: the ``torch.distributed`` backend each rank uses (``none``: no process group).
        framework: the library's backend wrapped around every cell, or None.
    """

    #: Whether the ranks form a torch process group (a rendezvous store is opened; broken ones re-formed).
    process_group = False
    #: Whether new ranks get a live peer's state through the driver after re-forming (no process group to carry it).
    copies_through_driver = False
    #: Whether a restart or rescale replaces every rank (the library cannot form its collective again).
    fresh_processes = False

    def __init__(self, name: str, torch_backend: str, framework: Optional[FrameworkBackend] = None) -> None:
        self.name = name
        self.torch_backend = torch_backend
        self.framework = framework

    @property
    def preload(self) -> Tuple[str, ...]:
        """Modules a new worker imports while the driver sets up the rest of the group."""
        return ("torch", "torch.distributed") if self.process_group else ()

    @property
    def needs_gpus(self) -> bool:
        """Whether the kind's collective runs only on GPUs (``nccl``)."""
        return self.torch_backend == "nccl"

    @property
    def stop_after_peer_failure_s(self) -> Optional[float]:
        """Seconds a rank may run on after a peer failed before it is stopped (None: its own code ends it)."""
        return self.framework.stop_after_peer_failure_s if self.framework is not None else None

    @contextlib.contextmanager
    def driver_cell(self, slots: Sequence[Any], targets: Sequence[int], local: bool) -> Iterator[List[Any]]:
        """Around one cell on the ``targets`` of ``slots``: yields per target the ``(backend, spec)`` its worker
        runs the cell inside, or None each when the kind has no library collective."""
        if self.framework is None:
            yield [None] * len(targets)
            return
        with self.framework.driver_cell([slots[r] for r in targets], local) as specs:
            yield [(self.framework, spec) for spec in specs]

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class TorchProcessGroup(GroupKind):
    """``gloo`` / ``nccl``: a torch process group carries state to new ranks."""

    process_group = True


class PeersThroughDriver(GroupKind):
    """``none``, XGBoost, LightGBM: new ranks get a live peer's state through the driver."""

    copies_through_driver = True


class FreshProcesses(GroupKind):
    """TensorFlow: every rank gets a fresh process on a restart or rescale."""

    fresh_processes = True


def backend_names() -> Tuple[str, ...]:
    """Every name ``backend=`` accepts: the torch backends, then the registered framework backends."""
    return TORCH_BACKENDS + frameworks.names()


def kind_for(backend: Optional[str], gpus_per_worker: float = 0) -> GroupKind:
    """The kind of a group asked for with ``backend`` (None: ``nccl`` with GPUs, ``gloo`` without).

    Raises:
        KeyError: an unknown name (the config checks names first, against :func:`backend_names`).
    """
    if backend is None:
        backend = "nccl" if gpus_per_worker else "gloo"
    if backend in TORCH_BACKENDS:
        return (PeersThroughDriver if backend == "none" else TorchProcessGroup)(backend, backend)
    framework = frameworks.get(backend)
    return (FreshProcesses if framework.fresh_processes else PeersThroughDriver)(backend, "none", framework)
