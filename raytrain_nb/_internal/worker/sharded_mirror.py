"""Mirrors of a rank's shards, and re-sharding a live FSDP2 model in place onto a new mesh from them.

Under full sharding a rank's shards exist nowhere else, so a lost rank cannot be rebuilt from the survivors. A
*mirror* is a copy of one rank's shards (model and optimizer state) as plain tensors with their place in the full
tensor (``offset`` along each dimension and the full ``shape``); the group keeps each rank's newest mirror in a
peer's memory (its buddy, ``group/mirrors.py``). After the process group re-forms (a restart, a rescale), every
rank re-shards its sharded modules *in place* onto the new 1-D mesh (the same module objects, new ``DTensor``
parameters, its optimizers pointed at them) and fills its new shards from the slices of the mirrors that overlap
them: DCP's N -> M resharding, done from memory.
"""
from __future__ import annotations

import itertools
import logging
from typing import Any, Dict, List, Sequence, Tuple

from .sharded import is_fsdp2, recipe_of

logger = logging.getLogger(__name__)

#: Numbers the meshes this process re-shards over (each mesh's dimension is named ``shard<n>``): see :func:`reshard`.
_MESHES = itertools.count(1)

def _piece(t: Any) -> Any:
    """A tensor as a mirror keeps it: a DTensor's local shard (a copy) with its offset and the full shape; a plain
    tensor (a buffer, an optimizer's step) as a copy."""
    from torch.distributed.tensor import DTensor  # torch.distributed: loaded only for sharded models

    if isinstance(t, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # DTensor's own

        _, offset = compute_local_shape_and_global_offset(t.shape, t.device_mesh, t.placements)
        return {"local": t.to_local().detach().to("cpu", copy=True), "offset": tuple(offset), "shape": tuple(t.shape)}
    if hasattr(t, "detach"):
        return {"plain": t.detach().to("cpu", copy=True)}
    return {"value": t}


def take(tracked: Any) -> Dict[str, Any]:
    """This rank's mirror: every sharded module's parameters and buffers and its optimizers' state, as pieces."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict  # sharded models only

    mirror: Dict[str, Any] = {"modules": {}, "optimizers": {}}
    for path, module in tracked.sharded.items():
        state = module.state_dict()
        mirror["modules"][path] = {k: _piece(v) for k, v in state.items()}
    for o_path, (opt, owner) in tracked.sharded_optimizers.items():
        osd = get_optimizer_state_dict(tracked.sharded[owner], opt)
        mirror["optimizers"][o_path] = {
            "owner": owner, "param_groups": osd["param_groups"],
            "state": {fqn: {k: _piece(v) for k, v in s.items()} for fqn, s in osd["state"].items()}}
    return mirror


def nbytes(mirror: Dict[str, Any]) -> int:
    """The bytes of a mirror's tensors."""
    total = 0
    for entries in [mirror["modules"].values(), [o["state"] for o in mirror["optimizers"].values()]]:
        for entry in entries:
            for value in entry.values():
                for piece in (value.values() if "local" not in value and "plain" not in value and "value" not in
                              value else [value]):
                    t = piece.get("local", piece.get("plain")) if isinstance(piece, dict) else None
                    if t is not None:
                        total += t.numel() * t.element_size()
    return total


# -- re-sharding in place ---------------------------------------------------------------------------------------

def _is_fsdp_hook(hook: Any) -> bool:
    """Whether a module hook is FSDP2's own (a bound method, a partial, a ``_WrappedHook`` or a lambda of its)."""
    fn = getattr(hook, "hook", hook)  # a load_state_dict pre-hook comes wrapped
    fn = getattr(fn, "__func__", getattr(fn, "func", fn))
    return getattr(fn, "__module__", "").startswith("torch.distributed.fsdp")


def _strip(model: Any) -> None:
    """Undo ``fully_shard`` on ``model`` and its submodules: their own classes back, FSDP's hooks and state gone,
    and each parameter a plain one of its full shape on the meta device (filled from mirrors later)."""
    import torch  # torch: loaded on first use, not on import raytrain_nb
    from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY  # FSDP2's marks on a module
    from torch.distributed._composable_state import _module_state_mapping  # FSDP2's registry of its states

    for module in model.modules():
        for name, param in list(module._parameters.items()):
            if param is not None and hasattr(param, "device_mesh"):
                module._parameters[name] = torch.nn.Parameter(torch.empty(param.shape, dtype=param.dtype,
                                                                          device="meta"),
                                                              requires_grad=param.requires_grad)
        # FSDP's hooks of the old layout, its state-dict ones too: each old FSDPParam's load_state_dict post-hook
        # copies the loaded parameter into its own padded shard of the old mesh, so one left behind breaks every
        # later load_state_dict once the shards grow (a rescale 3 -> 2, then a load) and keeps the old shards alive
        for hooks in (module._forward_pre_hooks, module._forward_hooks, module._state_dict_pre_hooks,
                      module._load_state_dict_pre_hooks, module._load_state_dict_post_hooks):
            for key, hook in list(hooks.items()):
                if _is_fsdp_hook(hook):
                    del hooks[key]
                    module._forward_pre_hooks_with_kwargs.pop(key, None)
                    module._forward_hooks_with_kwargs.pop(key, None)
                    module._forward_hooks_always_called.pop(key, None)
        if is_fsdp2(module):
            module.__class__ = module.__class__.__mro__[module.__class__._orig_cls_mro_index]
        _module_state_mapping.pop(module, None)
        registry = module.__dict__.get(REGISTRY_KEY)
        if isinstance(registry, dict):
            registry.pop("fully_shard", None)
        states = module.__dict__.get(STATE_KEY)
        if isinstance(states, dict):
            for func in [f for f in states if getattr(f, "__name__", "") == "fully_shard"]:
                del states[func]
        for attr in ("_is_fsdp_managed_module", "_fsdp_use_orig_params"):
            module.__dict__.pop(attr, None)


def reshard(tracked: Any, mirrors: Sequence[Dict[str, Any]], device: Any) -> List[str]:
    """Shard every tracked sharded module again over the new process group (a 1-D mesh of every rank), in
    place, fill the new shards from ``mirrors`` (every old rank's, in any order) and point its optimizers at
    the new parameters with their state. Returns the names re-sharded.

    Every rank calls it at the same point (``fully_shard`` makes the mesh, a collective).
    """
    import torch.distributed as dist  # torch.distributed: loaded only for sharded models
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from torch.distributed.device_mesh import init_device_mesh
    # torch.distributed's checkpoint and FSDP: loaded only for sharded models
    from torch.distributed.fsdp import fully_shard

    # A mesh of its own name: a DeviceMesh equals any other of the same shape, ranks and device whatever this
    # process's rank in it, and DTensor caches ops' output shardings by mesh; after a rescale that renumbered this
    # worker, an op on the new shards (to_empty making the parameters) would get the old mesh back, with the old
    # rank's coordinate, and the rank would fill and use another rank's slice of every tensor.
    mesh = init_device_mesh(device.type, (dist.get_world_size(),), mesh_dim_names=(f"shard{next(_MESHES)}",))
    done: List[str] = []
    for path, module in tracked.sharded.items():
        recipe = recipe_of(module)
        opts = {o: opt for o, (opt, owner) in tracked.sharded_optimizers.items() if owner == path}
        fqn_of = {o: _param_fqns(module, opt) for o, opt in opts.items()}
        _strip(module)
        named = dict(module.named_modules())
        for target in recipe["targets"]:
            fully_shard(named[target], mesh=mesh, **recipe["kwargs"])
        fully_shard(module, mesh=mesh, **recipe["kwargs"])
        module.to_empty(device=device)
        _fill_state(module.state_dict(), [m["modules"].get(path, {}) for m in mirrors])
        params = dict(module.named_parameters())
        for o, opt in opts.items():
            opt.state.clear()
            for group, fqns in zip(opt.param_groups, fqn_of[o]):
                group["params"] = [params[f] for f in fqns]
            saved = [m["optimizers"][o] for m in mirrors if o in m["optimizers"]]
            if saved:
                target = {"state": _empty_optim_state(params, saved), "param_groups": saved[0]["param_groups"]}
                _fill_optim(target["state"], [s["state"] for s in saved])
                set_optimizer_state_dict(module, opt, target)
            done.append(o)
        done.append(path)
    return done


def _param_fqns(module: Any, opt: Any) -> List[List[str]]:
    """Each parameter group's parameters of ``opt`` by their names in ``module``."""
    names = {id(p): n for n, p in module.named_parameters()}
    return [[names[id(p)] for p in g["params"]] for g in opt.param_groups]


def _copy_overlap(dst_local: Any, dst_offset: Tuple[int, ...], piece: Dict[str, Any]) -> None:
    """Copy the part of ``piece`` that overlaps the destination shard (both as offsets into the full tensor)."""
    src = piece["local"]
    if src.numel() == 0 or dst_local.numel() == 0:
        return
    dst_sl, src_sl = [], []
    for d in range(src.dim()):
        lo = max(dst_offset[d], piece["offset"][d])
        hi = min(dst_offset[d] + dst_local.shape[d], piece["offset"][d] + src.shape[d])
        if hi <= lo:
            return
        dst_sl.append(slice(lo - dst_offset[d], hi - dst_offset[d]))
        src_sl.append(slice(lo - piece["offset"][d], hi - piece["offset"][d]))
    dst_local[tuple(dst_sl)].copy_(src[tuple(src_sl)])


def _fill_one(target: Any, pieces: List[Dict[str, Any]]) -> Any:
    """Fill one tensor (a DTensor's local shard, or a plain tensor) from the mirrors' pieces of it."""
    import torch  # torch: loaded on first use, not on import raytrain_nb
    from torch.distributed.tensor import DTensor  # torch.distributed: loaded only for sharded models

    if isinstance(target, DTensor):
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset  # DTensor's own

        _, offset = compute_local_shape_and_global_offset(target.shape, target.device_mesh, target.placements)
        local = target.to_local()
        with torch.no_grad():
            for piece in pieces:
                if "local" in piece:
                    _copy_overlap(local, tuple(offset), {**piece, "local": piece["local"].to(local.device)})
        return target
    plain = next((p for p in pieces if "plain" in p or "value" in p), None)
    if plain is None:
        return target
    if "value" in plain:
        return plain["value"]
    if isinstance(target, torch.Tensor):
        with torch.no_grad():
            target.copy_(plain["plain"].to(target.device))
        return target
    return plain["plain"].clone()


def _fill_state(live: Dict[str, Any], saved: List[Dict[str, Any]]) -> None:
    """Fill a module's live state dict (its parameters and buffers, in place) from the mirrors' pieces."""
    for key, target in live.items():
        _fill_one(target, [s[key] for s in saved if key in s])


def _empty_optim_state(params: Dict[str, Any], saved: List[Dict[str, Any]]) -> Dict[str, Dict[str, Any]]:
    """An optimizer state shaped like the new shards: for each parameter and key, a tensor like the parameter
    (a DTensor on the new mesh) where the mirrors hold a shard, a plain value where they hold one."""
    import torch  # torch: loaded on first use, not on import raytrain_nb

    state: Dict[str, Dict[str, Any]] = {}
    for s in saved:
        for fqn, entry in s["state"].items():
            slot = state.setdefault(fqn, {})
            for key, piece in entry.items():
                if key in slot:
                    continue
                if "local" in piece:
                    slot[key] = torch.zeros_like(params[fqn].detach())
                elif "plain" in piece:
                    slot[key] = piece["plain"].clone()
                else:
                    slot[key] = piece["value"]
    return state


def _fill_optim(state: Dict[str, Dict[str, Any]], saved: List[Dict[str, Any]]) -> None:
    for fqn, entry in state.items():
        for key, target in entry.items():
            entry[key] = _fill_one(target, [s[fqn][key] for s in saved if fqn in s and key in s[fqn]])
