"""Framework backends (XGBoost, LightGBM...): the hook a group calls around each cell, on the driver and the workers.

A framework backend is a library whose workers talk through a collective of their own instead of
torch.distributed (the group's torch backend is then ``none``). The group wraps every cell and function
call in the backend's two context managers: :meth:`FrameworkBackend.driver_cell` on the driver (e.g. start
XGBoost's tracker for this cell) yields one picklable spec per targeted rank; each rank runs its code inside
:meth:`FrameworkBackend.worker_cell` with its spec (e.g. inside XGBoost's communicator). Backends are
registered by name (``raytrain_nb/__init__.py`` registers the built-in ones), so lower layers never import
the libraries' own modules; :func:`names` is what ``WorkerGroup(backend=...)`` accepts besides gloo/nccl/none.
"""
from __future__ import annotations

import contextlib
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple


#: Seconds a rank may keep running after a peer failed: then it is left in the library's collective (LightGBM
#: spins on a socket its peer closed cleanly, TensorFlow waits in an all-reduce its peer left), and the driver
#: stops it; ``%dist_restart`` replaces it.
STOP_AFTER_PEER_FAILURE_S = 15.0


class FrameworkBackend:
    """What a library needs set up around each cell. Subclasses override the two context managers.

    Attributes:
        name: what ``WorkerGroup(backend=...)`` and ``%%distributed --backend`` take.
        extra: the ``raytrain_nb[...]`` extra that installs the library.
        fresh_processes: see below.
    """

    name = ""
    extra = ""
    #: Why the library cannot form its collective again in a live process ("" when it can): a group on it
    #: cannot restart or rescale in place, and a trainer starts fresh processes for every rank on a failure.
    fresh_processes = ""
    #: Seconds a rank may keep running after a peer failed before the driver stops it (kills its process): the
    #: library's collective runs in C++ where nothing releases it. None: never (the rank's own code ends it).
    stop_after_peer_failure_s: Optional[float] = None

    @contextlib.contextmanager
    def driver_cell(self, workers: Sequence[Any], local: bool) -> Iterator[List[Any]]:
        """On the driver, around one cell on ``workers`` (the targeted slots in rank order; each has
        ``.actor`` and ``.info``); ``local``: every rank of the group is on this machine. Yields one
        picklable spec per worker, passed to :meth:`worker_cell` on that rank."""
        yield [None] * len(workers)

    @contextlib.contextmanager
    def worker_cell(self, spec: Any) -> Iterator[None]:
        """On a worker's cell thread, around the user's code of one cell (its failures are the cell's)."""
        yield

    def training_steps(self, namespace: Dict[str, Any]) -> int:
        """On a worker: a count that grows as the library's models in ``namespace`` train (Keras: the optimizers'
        step counters). A cell during which it grew trained, so it is not a setup cell and is not replayed."""
        return 0

    def release(self, spec: Any) -> bool:
        """On a worker's control thread while its cell runs: make the cell thread, blocked in the library's
        collective, fail now (a peer failed). Returns whether anything was released."""
        return False


_REGISTRY: Dict[str, FrameworkBackend] = {}


def register(backend: FrameworkBackend) -> None:
    """Make ``backend`` available by its name (idempotent)."""
    _REGISTRY[backend.name] = backend


def get(name: str) -> FrameworkBackend:
    """The registered backend called ``name``.

    Raises:
        KeyError: no such backend (``names()`` lists them).
    """
    return _REGISTRY[name]


def names() -> Tuple[str, ...]:
    """The registered framework backends' names."""
    return tuple(_REGISTRY)


def find(name: Optional[str]) -> Optional[FrameworkBackend]:
    """The backend called ``name``, or None for a torch backend (gloo, nccl, none) or None."""
    return _REGISTRY.get(name) if name else None


_current: Optional[Tuple[FrameworkBackend, Any]] = None  # the (backend, spec) of the cell running now


def call_in(framework: Optional[Tuple[FrameworkBackend, Any]], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)`` inside ``framework``'s worker context (``(backend, spec)``), or plainly when None."""
    global _current
    if framework is None:
        return fn(*args)
    backend, spec = framework
    with backend.worker_cell(spec):
        _current = framework
        try:
            return fn(*args)
        finally:
            _current = None


def release_current() -> bool:
    """Release the running cell from its framework backend's collective (see :meth:`FrameworkBackend.release`)."""
    current = _current
    return current[0].release(current[1]) if current is not None else False
