"""The tracked warm state of a worker's namespace: collect it, save it, load it back in place.

Tracked = every ``torch.nn.Module`` (a DDP wrapper counts as its module),
optimizer, LR scheduler and ``GradScaler`` bound to a name in the namespace,
XGBoost and LightGBM boosters (:mod:`.boosters`), Keras models with their
optimizers (:mod:`.keras_models`), plus the torch/numpy/python RNG states (plain data, :mod:`.rng`), plus the plain variables the user names (kept apart:
only they may need unpickling). Rollback loads the values into the same
objects, so references the user holds stay valid.
"""
from __future__ import annotations

import dataclasses
import hashlib
import io
import pickle
import sys
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import SnapshotError
from . import keras_models, rng
from .boosters import is_booster, load_into, model_bytes
from .copy_pool import CopyPool
from .sharded import check_mesh, is_sharded, sort_sharded
from .walk import walk

_PLAIN = (int, float, str, bool, type(None), bytes)


#: The kinds of tracked objects: the fields of :class:`Tracked` and the keys of a saved state's replicated part.
KINDS = ("modules", "optimizers", "schedulers", "scalers", "boosters", "keras")


@dataclasses.dataclass
class Tracked:
    """Objects found in a namespace, by name."""

    modules: Dict[str, Any]
    optimizers: Dict[str, Any]
    schedulers: Dict[str, Any]
    scalers: Dict[str, Any]
    wrappers: Dict[str, Any] = dataclasses.field(default_factory=dict)  # DDP wrappers, by path
    boosters: Dict[str, Any] = dataclasses.field(default_factory=dict)  # XGBoost / LightGBM boosters
    keras: Dict[str, Any] = dataclasses.field(default_factory=dict)  # Keras models (with their optimizers)
    sharded: Dict[str, Any] = dataclasses.field(default_factory=dict)  # FSDP2 modules: each rank its own shards
    #: optimizers of sharded modules: path -> (optimizer, the sharded module's path)
    sharded_optimizers: Dict[str, Any] = dataclasses.field(default_factory=dict)

    def names(self) -> List[str]:
        return sorted([name for kind in KINDS for name in getattr(self, kind)] + list(self.sharded)
                      + list(self.sharded_optimizers))


def unwrap(module: Any) -> Any:
    """The module inside a DDP (or DataParallel) wrapper; any other object as it is."""
    return getattr(module, "module", module) if type(module).__name__ in (
        "DistributedDataParallel", "DataParallel") else module


def _torch_classes() -> Tuple[type, type, type]:
    """torch's ``Module``, ``Optimizer`` and ``LRScheduler``; a class no object is an instance of stands in for
    each while torch is not imported (then no object is one: an XGBoost rank never loads torch to look)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return (_NoTorch, _NoTorch, _NoTorch)
    return (torch.nn.Module, torch.optim.Optimizer, torch.optim.lr_scheduler.LRScheduler)


class _NoTorch:
    """No object is one (:func:`_torch_classes` while torch is not imported)."""


def is_tracked_type(obj: Any) -> bool:
    """A module, optimizer, LR scheduler or grad scaler (the walk does not descend into these)."""
    return isinstance(obj, _torch_classes()) or (
        type(obj).__name__ == "GradScaler" and hasattr(obj, "state_dict")) or is_booster(obj) or (
        keras_models.is_keras_model(obj))


def find_tracked(namespace: Dict[str, Any], strict: bool = True) -> Tracked:
    """Find the modules, optimizers, schedulers and grad scalers reachable from the names.

    Each is keyed by the path a user would write (``model``, ``models['G']``, ``trainer.opt``; see
    :mod:`.walk`); a DDP wrapper counts as its module, and its path is also in ``wrappers``.

    Raises:
        SnapshotError: with ``strict``, an optimizer whose parameters belong to no tracked module
            (rollback would restore its momentum but not the weights); without, such optimizers
            are left out.
    """
    module_class, optimizer_class, scheduler_class = _torch_classes()
    tracked = Tracked({}, {}, {}, {})
    seen_modules: Dict[int, str] = {}
    for path, obj in walk(namespace, is_tracked_type):
        if type(obj).__name__ == "FullyShardedDataParallel":  # each rank holds a shard: no replicated copy
            if strict:
                raise SnapshotError(f"{path!r} is an FSDP model (prepare_model(parallel_strategy='fsdp')): its "
                                    "parameters are sharded across the ranks, so snapshots cannot hold it; use FSDP2 "
                                    "(parallel_strategy='fsdp2'), whose snapshots keep each rank's shards, or save it "
                                    "with torch.distributed.checkpoint and report(checkpoint=...)")
            continue  # never broadcast from a peer: every rank's shard differs
        if isinstance(obj, module_class) and is_sharded(obj):  # FSDP2: DTensor shards, written by every rank
            if all(id(obj) != id(m) for m in tracked.sharded.values()):
                check_mesh(obj, path)
                tracked.sharded[path] = obj
        elif isinstance(obj, module_class):
            inner = unwrap(obj)
            if inner is not obj:
                tracked.wrappers[path] = obj
            if id(inner) not in seen_modules:  # `model` and `model.module` are one module
                seen_modules[id(inner)] = path
                tracked.modules[path] = inner
        elif isinstance(obj, optimizer_class):
            tracked.optimizers[path] = obj
        elif isinstance(obj, scheduler_class):
            tracked.schedulers[path] = obj
        elif type(obj).__name__ == "GradScaler" and hasattr(obj, "state_dict"):
            tracked.scalers[path] = obj
        elif is_booster(obj):
            tracked.boosters[path] = obj
        elif keras_models.is_keras_model(obj):
            tracked.keras[path] = obj
    sort_sharded(tracked)
    params = {id(p) for m in tracked.modules.values() for p in m.parameters()}
    for path, opt in list(tracked.optimizers.items()):
        if not any(id(p) in params for g in opt.param_groups for p in g["params"]):
            if not strict:
                del tracked.optimizers[path]
                continue
            raise SnapshotError(
                f"optimizer {path!r} optimizes parameters of no model bound to a name: bind the model to a "
                "variable (e.g. model = ...) so its weights are saved with the optimizer's state"
            )
    return tracked


def rng_state() -> Dict[str, Any]:
    """torch, numpy and python RNG states as JSON-able data (:mod:`.rng`)."""
    return rng.encode()


def set_rng_state(state: Dict[str, Any]) -> None:
    """Set the generators to ``state``: :func:`rng_state`'s form or an older snapshot's tensors."""
    rng.apply(rng.decode(state))


def cpu_state(obj: Any, copy: bool = True, pool: Optional[CopyPool] = None) -> Any:
    """A state dict with every tensor on the CPU; with ``copy``, a deep copy (consistent while training goes on),
    into ``pool``'s spare buffers where it has them."""
    import torch  # torch: loaded on first use, not on import raytrain_nb

    if isinstance(obj, torch.Tensor):
        return pool.copy(obj) if copy and pool is not None else obj.detach().to("cpu", copy=copy)
    if isinstance(obj, dict):
        return {k: cpu_state(v, copy, pool) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(cpu_state(v, copy, pool) for v in obj)
    return obj


def tensors_of(obj: Any) -> List[Any]:
    """Every tensor in a (nested) state."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, dict):
        return [t for v in obj.values() for t in tensors_of(v)]
    if isinstance(obj, (list, tuple)):
        return [t for v in obj for t in tensors_of(v)]
    return []


def capture(namespace: Dict[str, Any], var_names: Sequence[str] = (), copy: bool = True,
            shared: bool = True, pool: Optional[CopyPool] = None
            ) -> Tuple[Dict[str, Any], Dict[str, Any], Dict[str, Any]]:
    """The tracked state now: ``(replicated, own, variables)``.

    Pass ``copy=False`` when it is written before user code runs again. ``replicated``
    (modules, optimizers, schedulers, scalers) is the same on every rank and written by rank 0;
    ``own`` (RNG states) is this rank's; ``variables`` are the plain variables named by
    ``var_names``, written apart (rank 0) because only they may need unpickling to load. Copies of the
    replicated state go into ``pool``'s spare buffers where it has them. With
    ``shared=False`` (a rank that does not write them) ``replicated`` and ``variables`` come back empty:
    nothing is copied that is not written.

    Raises:
        SnapshotError: a named variable does not exist.
    """
    _check_vars(namespace, var_names)
    if not shared:
        return {}, {"rng": rng_state()}, {}
    tracked = find_tracked(namespace)
    replicated = {
        "modules": {n: cpu_state(m.state_dict(), copy, pool) for n, m in tracked.modules.items()},
        "optimizers": {n: cpu_state(o.state_dict(), copy, pool) for n, o in tracked.optimizers.items()},
        "schedulers": {n: cpu_state(s.state_dict(), copy) for n, s in tracked.schedulers.items()},
        "scalers": {n: cpu_state(s.state_dict(), copy) for n, s in tracked.scalers.items()},
        "boosters": {n: model_bytes(b) for n, b in tracked.boosters.items()},
        "keras": {n: keras_models.model_state(m) for n, m in tracked.keras.items()},
    }
    return replicated, {"rng": rng_state()}, {n: cpu_state(namespace[n], copy) for n in var_names}


def _check_vars(namespace: Dict[str, Any], var_names: Sequence[str]) -> None:
    missing = [v for v in var_names if v not in namespace]
    if missing:
        raise SnapshotError(f"--vars names variable(s) {', '.join(missing)} that do not exist on the workers")


def check_capturable(namespace: Dict[str, Any], var_names: Sequence[str], shared: bool) -> None:
    """Raise now what :func:`capture` would raise (a missing variable; with ``shared``, an optimizer of no
    tracked model), for a capture that runs later."""
    _check_vars(namespace, var_names)
    if shared:
        find_tracked(namespace)


def fingerprint(namespace: Dict[str, Any]) -> Dict[str, str]:
    """A short digest of each plain variable (numbers, strings...), to tell what changed later."""
    out: Dict[str, str] = {}
    for name, value in namespace.items():
        if name.startswith("_") or not isinstance(value, _PLAIN + (tuple, list)):
            continue
        if isinstance(value, (tuple, list)) and (len(value) > 100 or not all(isinstance(v, _PLAIN) for v in value)):
            continue
        out[name] = hashlib.sha1(repr(value).encode()).hexdigest()[:12]
    return out


def changed_since(namespace: Dict[str, Any], before: Dict[str, str], restored: Sequence[str]) -> List[str]:
    """Plain variables, not restored, whose value differs from the snapshot's (or that are new/gone)."""
    now = fingerprint(namespace)
    names = (set(before) | set(now)) - set(restored)
    return sorted(n for n in names if before.get(n) != now.get(n) and n not in ("In", "Out"))


def kind_of(obj: Any) -> Optional[str]:
    """The key of ``obj``'s kind in a saved state: ``modules``, ``optimizers``, ``schedulers``,
    ``scalers``, ``boosters``, ``keras``; None for anything else."""
    import torch  # torch: loaded on first use, not on import raytrain_nb

    if isinstance(obj, torch.nn.Module):
        return "modules"
    if isinstance(obj, torch.optim.Optimizer):
        return "optimizers"
    if isinstance(obj, torch.optim.lr_scheduler.LRScheduler):
        return "schedulers"
    if type(obj).__name__ == "GradScaler" and hasattr(obj, "state_dict"):
        return "scalers"
    if is_booster(obj):
        return "boosters"
    if keras_models.is_keras_model(obj):
        return "keras"
    return None


def structure_problem(kind: str, obj: Any, state: Dict[str, Any]) -> Optional[str]:
    """How a saved state does not fit ``obj`` (names and shapes of a module's tensors, the parameter
    groups of an optimizer), or None when it loads."""
    if kind == "modules":
        live = unwrap(obj).state_dict()
        for key, value in state.items():
            if key not in live:
                return f"the saved {key!r} is not in the model"
            if hasattr(value, "shape") and tuple(live[key].shape) != tuple(value.shape):
                return f"{key!r} has shape {tuple(value.shape)} saved but {tuple(live[key].shape)} here"
        missing = sorted(set(live) - set(state))
        return f"{', '.join(repr(k) for k in missing[:3])} not saved" if missing else None
    if kind == "keras":
        return keras_models.structure_problem(obj, state)
    if kind == "optimizers":
        saved = [len(g.get("params", ())) for g in state.get("param_groups", ())]
        here = [len(g["params"]) for g in obj.param_groups]
        if saved != here:
            return f"parameter groups of {saved} parameters saved but {here} here"
    return None


def restore(namespace: Dict[str, Any], replicated: Dict[str, Any], generators: Optional[Dict[str, Any]],
            variables: Optional[Dict[str, Any]] = None, action: str = "roll back") -> List[str]:
    """Load saved state into the same objects in ``namespace``; return the names restored.

    ``generators``: this rank's RNG states as :func:`.rng.decode` checked them (None: left as they are).
    ``variables`` are the plain variables to bind again; None takes them from
    ``replicated["vars"]``, where snapshots written before ``vars.pt`` kept them. ``action``
    names what is done, for errors (``roll back``, ``load``).

    Raises:
        SnapshotError: a saved object is not in the namespace (or changed type/shape);
            nothing is loaded in that case.
    """
    import torch  # torch: loaded on first use, not on import raytrain_nb

    tracked = find_tracked(namespace)
    kinds = [(kind, getattr(tracked, kind)) for kind in KINDS]
    lost = [f"{name} ({kind[:-1]})" for kind, live in kinds for name in replicated.get(kind, {}) if name not in live]
    if lost:
        how = ("no longer exist in the workers' namespace; re-create them (re-run their cell)" if action == "roll back"
               else "do not exist in the workers' namespace; create them under these names")
        raise SnapshotError(f"cannot {action}: {', '.join(lost)} {how}, then {action} again")
    for kind, live in kinds:  # check every structure before loading anything
        for name, state in replicated.get(kind, {}).items():
            problem = structure_problem(kind, live[name], state)
            if problem:
                raise SnapshotError(f"cannot {action} {name!r}: its structure differs from the saved one "
                                    f"({problem}); nothing was loaded")
    restored: List[str] = []
    with torch.no_grad():
        for kind, live in kinds:
            for name, state in replicated.get(kind, {}).items():
                if kind == "boosters":
                    load_into(live[name], state)
                elif kind == "keras":
                    keras_models.load_model_state(live[name], state)
                else:
                    live[name].load_state_dict(state)
                restored.append(name)
    for name, value in (replicated.get("vars", {}) if variables is None else variables).items():
        namespace[name] = value
        restored.append(name)
    if generators is not None:
        rng.apply(generators)
    return restored


def dumps(state: Dict[str, Any]) -> bytes:
    import torch  # torch: loaded on first use, not on import raytrain_nb

    buf = io.BytesIO()
    torch.save(state, buf)
    return buf.getvalue()


def loads(data: Any, what: str, allow_pickle: bool = False, *, may_pickle: bool = True) -> Dict[str, Any]:
    """Load a saved state (bytes, or a local file path, memory-mapped) with ``weights_only=True``.

    Args:
        data: the file's bytes, or a local path.
        what: the file, as errors name it.
        allow_pickle: load with ``weights_only=False`` (only where ``may_pickle``).
        may_pickle: whether ``allow_pickle`` may apply to this file at all: only the plain
            variables' file; weights and RNG states never unpickle code.

    Raises:
        SnapshotError: the file is truncated, edited or needs unpickling that was not allowed.
    """
    import torch  # torch: loaded on first use, not on import raytrain_nb

    allow_pickle = allow_pickle and may_pickle
    try:
        if isinstance(data, str):
            return torch.load(data, weights_only=not allow_pickle, map_location="cpu", mmap=True)
        return torch.load(io.BytesIO(data), weights_only=not allow_pickle, map_location="cpu")
    except pickle.UnpicklingError as exc:
        first = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        if allow_pickle:
            raise SnapshotError(f"{what} is damaged: {first}") from None
        fix = ("roll back with allow_pickle=True if you trust this storage" if may_pickle else
               "allow_pickle applies only to vars.pt, so this file never loads: take a new snapshot")
        raise SnapshotError(f"{what} holds objects that only load by unpickling code ({first}); {fix}") from None
    except (RuntimeError, EOFError, ValueError, OSError) as exc:
        raise SnapshotError(f"{what} is truncated or damaged ({type(exc).__name__}: "
                            f"{str(exc).splitlines()[0][:160]}); nothing was loaded") from None
