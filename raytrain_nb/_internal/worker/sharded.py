"""FSDP2 on a worker: ``prepare_model(parallel_strategy="fsdp2")`` and telling a sharded model when one is seen.

A model is *sharded* when ``torch.distributed.fsdp.fully_shard`` was applied to it (by ``prepare_model`` or by
hand, as Ray Train's FSDP2 guide does): its class is then an ``FSDPModule`` and its parameters are ``DTensor``
shards of a 1-D device mesh. Each rank holds only its own shards, so nothing about such a model is replicated:
snapshots write it with PyTorch Distributed Checkpoint (:mod:`.sharded_io`), never through rank 0.
"""
from __future__ import annotations

import logging
import sys
from typing import Any, Dict, List, Optional, Sequence

logger = logging.getLogger(__name__)

#: The keys of ``parallel_strategy_kwargs`` that ``prepare_model(parallel_strategy="fsdp2")`` takes, besides
#: ``fully_shard``'s own (``mp_policy``, ``offload_policy``, ``reshard_after_forward``, ``mesh``).
POLICY_KEYS = ("shard_children",)

RECIPE = "_rtnb_fsdp2"  # the attribute on a root module: how it was sharded (targets by path, fully_shard's kwargs)


def remember_recipe(model: Any, targets: Sequence[Any], kwargs: Dict[str, Any]) -> None:
    """Keep on ``model`` how it was sharded, so it can be sharded again onto another mesh."""
    names = {id(m): n for n, m in model.named_modules()}
    setattr(model, RECIPE, {"targets": [names[id(t)] for t in targets], "kwargs": dict(kwargs)})


def recipe_of(model: Any) -> Dict[str, Any]:
    """How ``model`` was sharded: remembered by ``prepare_model``, or (sharded by hand) every ``FSDPModule`` below
    the root, with ``fully_shard``'s defaults."""
    kept = getattr(model, RECIPE, None)
    if kept is not None:
        return kept
    return {"targets": [n for n, m in model.named_modules() if n and is_fsdp2(m)], "kwargs": {}}


def is_fsdp2(module: Any) -> bool:
    """Whether ``module`` (or its root) was ``fully_shard``-ed: an ``FSDPModule`` (without importing FSDP)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    cls = getattr(fsdp, "FSDPModule", None) if fsdp is not None else None
    return cls is not None and isinstance(module, cls)


class ShardedPull(Exception):
    """Raised by a worker's ``pull`` of a sharded module: the driver gathers it (below a size) or refuses.

    ``share`` is :func:`local_share`'s answer (the model's bytes in all, the mesh size)."""

    def __init__(self, name: str, share: Dict[str, int]) -> None:
        super().__init__(name, share)
        self.name, self.share = name, share


def full_state(module: Any) -> Dict[str, Any]:
    """The full (gathered) state dict of a sharded module, as CPU tensors (every rank calls it: all-gathers)."""
    out: Dict[str, Any] = {}
    for key, value in module.state_dict().items():
        full = value.full_tensor() if hasattr(value, "full_tensor") else value
        out[key] = full.detach().to("cpu", copy=True) if hasattr(full, "detach") else full
    return out


def class_name(obj: Any) -> str:
    """``obj``'s class name; a sharded module's own (``Net``, not FSDP's ``FSDPNet``): a new rank's model, sharded
    only once the group forms, is the same object."""
    cls = type(obj)
    if is_fsdp2(obj):
        cls = cls.__mro__[getattr(cls, "_orig_cls_mro_index", 2)]
    return cls.__qualname__


def is_sharded(module: Any) -> bool:
    """Whether any parameter of ``module`` is a ``DTensor`` (a model sharded by hand or by ``prepare_model``)."""
    if is_fsdp2(module) or (getattr(module, RECIPE, None) or {}).get("deferred"):
        return True  # a new rank's model, sharded when the group forms (prepare_model while replaying)
    dtensor = sys.modules.get("torch.distributed.tensor")
    cls = getattr(dtensor, "DTensor", None) if dtensor is not None else None
    if cls is None:
        return False
    if isinstance(module, cls):  # a parameter
        return True
    return hasattr(module, "parameters") and callable(module.parameters) and any(
        isinstance(p, cls) for p in module.parameters())


def mesh_of(module: Any) -> Any:
    """The device mesh of a sharded module's parameters (the first DTensor's), or None."""
    for p in module.parameters():
        mesh = getattr(p, "device_mesh", None)
        if mesh is not None:
            return mesh
    return None


def check_mesh(module: Any, path: str) -> None:
    """Refuse a model sharded over a mesh of more than one dimension (tensor parallel, HSDP) in one line.

    Raises:
        ValueError: the mesh has ``ndim > 1``.
    """
    mesh = mesh_of(module)
    if mesh is not None and mesh.ndim != 1:
        raise ValueError(f"{path!r} is sharded over a {mesh.ndim}-D device mesh {tuple(mesh.shape)}: only 1-D meshes "
                         "(fully_shard over every rank) are supported for now; shard it over a 1-D mesh")


def local_share(module: Any) -> Dict[str, int]:
    """This rank's share of a sharded module: ``{"local_bytes": ..., "total_bytes": ..., "mesh_size": ...}``."""
    local = total = 0
    for p in module.parameters():
        t = getattr(p, "_local_tensor", p)
        local += t.numel() * t.element_size()
        total += p.numel() * p.element_size()
    mesh = mesh_of(module)
    return {"local_bytes": int(local), "total_bytes": int(total), "mesh_size": int(mesh.size()) if mesh else 1}


def sort_sharded(tracked: Any) -> None:
    """In a :class:`~.snapshot.Tracked`: sharded modules nested in another sharded one count as that one;
    optimizers of a sharded module's parameters move to ``sharded_optimizers`` (they hold shards too)."""
    if not tracked.sharded:
        return
    inner = {id(m) for top in tracked.sharded.values() for m in top.modules() if m is not top}
    for path in [p for p, m in tracked.sharded.items() if id(m) in inner]:
        del tracked.sharded[path]
    for path in [p for p, m in tracked.modules.items() if id(m) in inner]:
        del tracked.modules[path]
    owners = {id(p): path for path, m in tracked.sharded.items() for p in m.parameters()}
    for path, opt in list(tracked.optimizers.items()):
        owner = next((owners[id(p)] for g in opt.param_groups for p in g["params"] if id(p) in owners), None)
        if owner is not None:
            tracked.sharded_optimizers[path] = (opt, owner)
            del tracked.optimizers[path]


def shard_targets(model: Any, shard_children: Optional[List[str]]) -> List[Any]:
    """The submodules ``fully_shard`` is applied to before the root: the children that hold parameters (the
    default), or the named ones; a child that is a ``ModuleList`` / ``Sequential`` contributes its own children
    (each block of a transformer's layer list)."""
    import torch  # torch: loaded on first use, not on import raytrain_nb

    if shard_children is not None:
        named = dict(model.named_modules())
        missing = [n for n in shard_children if n not in named]
        if missing:
            raise ValueError(f"parallel_strategy_kwargs['shard_children'] names {', '.join(map(repr, missing))}, "
                             f"which are not submodules of {type(model).__name__}: use names from "
                             "model.named_modules()")
        return [named[n] for n in shard_children]
    targets: List[Any] = []
    for child in model.children():
        if isinstance(child, (torch.nn.ModuleList, torch.nn.Sequential)):
            targets.extend(c for c in child.children() if any(True for _ in c.parameters()))
        elif any(True for _ in child.parameters()):
            targets.append(child)
    return targets


def require_process_group(strategy: str, device: Any, joined: bool) -> None:
    """What sharding (``parallel_strategy`` ``fsdp`` or ``fsdp2``) needs of this rank: a process group, and gloo on
    CPU. Raises RuntimeError naming the fix."""
    if not joined:
        raise RuntimeError(f"prepare_model(parallel_strategy={strategy!r}) needs a process group: use TorchTrainer or "
                           "a %%distributed group with --backend gloo or nccl, not --backend none")
    import torch.distributed as dist  # torch.distributed: loaded only for sharded models

    backend = dist.get_backend()
    if device.type == "cpu" and backend != "gloo":
        raise RuntimeError(f"prepare_model(parallel_strategy={strategy!r}) on CPU needs the gloo backend, not "
                           f"{backend}: use TorchConfig(backend='gloo')")


def prepare_fsdp2(model: Any, device: Any, kwargs: Dict[str, Any], joined: bool, deferred: bool) -> Any:
    """``fully_shard`` each target (:func:`shard_targets`) and then the root, over every rank of the group.

    Args:
        model: the module (already on ``device``).
        device: this worker's device.
        kwargs: ``fully_shard``'s keyword arguments (``mp_policy=MixedPrecisionPolicy(...)``,
            ``offload_policy=CPUOffloadPolicy()``, ``reshard_after_forward``, ``mesh`` (1-D)) plus
            ``shard_children`` (names of submodules to shard, in place of the default).
        joined: a process group is formed.
        deferred: a new rank replays setup cells (no group yet).

    Returns:
        The same model object, now an ``FSDPModule`` with ``DTensor`` parameters.
    """
    shard_children = kwargs.pop("shard_children", None)
    mesh = kwargs.pop("mesh", None)
    if mesh is not None and mesh.ndim != 1:
        raise ValueError(f"prepare_model(parallel_strategy='fsdp2'): a {mesh.ndim}-D mesh {tuple(mesh.shape)} is "
                         "not supported for now (tensor parallel, HSDP): pass a 1-D mesh or none")
    targets = shard_targets(model, shard_children)
    if deferred:  # a new rank replaying setup cells: sharded (and filled from the mirrors) once the group forms
        remember_recipe(model, targets, kwargs)
        getattr(model, RECIPE)["deferred"] = True
        return model
    require_process_group("fsdp2", device, joined)
    import torch.distributed as dist  # torch.distributed.fsdp: loaded only for FSDP2
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from torch.distributed.device_mesh import init_device_mesh
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from torch.distributed.fsdp import fully_shard

    if is_fsdp2(model):
        raise ValueError(f"prepare_model(parallel_strategy='fsdp2'): {type(model).__name__} is already sharded "
                         "(fully_shard was applied); pass the model before sharding, or use it as it is")
    if mesh is None:
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
    for target in targets:
        fully_shard(target, mesh=mesh, **kwargs)
    fully_shard(model, mesh=mesh, **kwargs)
    remember_recipe(model, targets, kwargs)  # to shard it again over another mesh (restart, rescale)
    return model
