"""Where a worker's cell thread is: its Python stack, and the ``torch.distributed`` call it waits in.

The collectives of ``torch.distributed`` (``all_reduce``, ``barrier``, ...) are wrapped once torch.distributed is
imported, so each records its name and when it was entered (a module-level slot: one cell thread per process);
``%dist_where`` then says ``in all_reduce for 61 s``. DDP's gradient sync runs in autograd's C++ threads: the cell
thread shows it as ``loss.backward()``, which a rank holding a ``DistributedDataParallel`` model names as such.
"""
from __future__ import annotations

import functools
import os
import sys
import time
import traceback
from typing import Any, Dict, List, Optional, Tuple

#: The blocking collectives and point-to-point calls of ``torch.distributed`` that are wrapped.
COLLECTIVES = ("all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all",
               "all_to_all_single", "barrier", "monitored_barrier", "broadcast", "broadcast_object_list",
               "gather", "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
               "scatter_object_list", "send", "recv")

#: (name, monotonic time entered) of the collective the cell thread is in, or None.
_ENTERED: Optional[Tuple[str, float]] = None
_WRAPPED = "__rtnb_where__"


def _wrap(name: str, fn: Any) -> Any:
    @functools.wraps(fn)
    def entered(*args: Any, **kwargs: Any) -> Any:
        global _ENTERED
        outer = _ENTERED
        _ENTERED = (name, time.monotonic())
        try:
            return fn(*args, **kwargs)
        finally:
            _ENTERED = outer

    setattr(entered, _WRAPPED, True)
    return entered


def watch_collectives() -> None:
    """Wrap ``torch.distributed``'s collectives (once; only if the user's code imported it)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return
    for name in COLLECTIVES:
        fn = getattr(dist, name, None)
        if fn is not None and not getattr(fn, _WRAPPED, False):
            setattr(dist, name, _wrap(name, fn))


def in_collective() -> Optional[Dict[str, Any]]:
    """``{"name", "seconds"}`` of the ``torch.distributed`` call the cell thread waits in, or None."""
    entered = _ENTERED
    if entered is None:
        return None
    return {"name": entered[0], "seconds": time.monotonic() - entered[1]}


_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def frames_of(frame: Any) -> List[Dict[str, Any]]:
    """The stack from ``frame`` outwards, oldest first, as ``{"file", "line", "function", "code", "user"}``
    (``user``: the notebook's cells and the user's own files, not this package, Ray or the standard library)."""
    out = []
    for summary in traceback.extract_stack(frame):
        file = summary.filename
        user = file.startswith("<cell-") or not (file.startswith(_OWN_DIR) or "site-packages" in file
                                                 or file.startswith((sys.prefix, sys.base_prefix, "<frozen")))
        out.append({"file": file, "line": summary.lineno, "function": summary.name,
                    "code": (summary.line or "").strip(), "user": user})
    while out and not out[0]["user"]:  # the worker's own frames below the first user frame
        out.pop(0)
    return [f for f in out if not f["file"].startswith(_OWN_DIR)]  # nor ours above it (the collective's wrapper)


def ddp_in(namespace: Dict[str, Any]) -> bool:
    """Whether the rank's namespace holds a ``DistributedDataParallel`` model (its backward syncs gradients)."""
    torch = sys.modules.get("torch")
    if torch is None or "torch.nn.parallel" not in sys.modules:
        return False
    ddp = torch.nn.parallel.DistributedDataParallel
    return any(isinstance(v, ddp) for v in list(namespace.values()))


def where(thread_id: Optional[int], call: Optional[str], namespace: Dict[str, Any],
          debugging: bool = False) -> Dict[str, Any]:
    """What the cell thread ``thread_id`` does now: ``call`` (the worker call it runs, None when idle), its
    ``frames``, the ``collective`` it waits in, ``ddp`` (a DDP model is held) and ``debugging`` (at a prompt)."""
    frame = sys._current_frames().get(thread_id) if thread_id is not None else None
    frames = frames_of(frame) if frame is not None and call is not None else []
    return {"call": call, "frames": frames, "collective": in_collective() if frames else None,
            "ddp": bool(frames) and ddp_in(namespace), "debugging": debugging, "pid": os.getpid()}
