"""Sweeps that start warm: a group's snapshot as every trial's starting checkpoint, and state saved and loaded by variable name.

The format is the snapshot's (``replicated.pt``: each saved object's ``state_dict`` under its
variable name, loaded with ``weights_only=True``; ``snapshot.json``), so the three steps meet:

1. ``warm = warm_start(group, "warm")``: the group's snapshot as a :class:`Checkpoint`, passed to
   each trial's ``TorchTrainer(..., resume_from_checkpoint=warm)``; ``get_checkpoint()`` returns it;
2. in the trial, ``load_state(get_checkpoint(), model=model, opt=opt)`` and, when reporting,
   ``report(metrics, checkpoint=save_state(tmpdir, model=model, opt=opt))``;
3. ``group.load(results.get_best_result())`` loads the winner into the group's ``model`` and ``opt``.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional

from ..checkpoint.checkpoint import Checkpoint
from ..checkpoint.sources import as_checkpoint
from ..errors import CheckpointError, ConfigError
from ..group.group import WorkerGroup
from ..worker.boosters import load_into, model_bytes
from ..worker.session import get_context
from ..worker.sharded import is_sharded
from ..worker.snapshot import cpu_state, kind_of, structure_problem, unwrap
from ..worker.snapshot_io import read_replicated, state_files, write_state

logger = logging.getLogger(__name__)

#: The kinds of objects saved by name, as the snapshot's ``replicated.pt`` keys them (a booster as its model bytes).
KINDS = ("modules", "optimizers", "schedulers", "scalers", "boosters")


def warm_start(source: Any, name: Optional[str] = None) -> Checkpoint:
    """The checkpoint every trial of a sweep starts from: a snapshot of a group that has trained.

    Pass it to each trial's trainer (``TorchTrainer(..., resume_from_checkpoint=warm)``); in the
    training function ``get_checkpoint()`` returns it until the trial reports a checkpoint of its
    own, and :func:`load_state` loads its objects by name. Checked here, on the driver, so a wrong
    checkpoint fails once instead of in every trial.

    Args:
        source: a :class:`~raytrain_nb.WorkerGroup` (its snapshot ``name``, or its latest one), an
            entry of ``group.checkpoints()`` (what ``group.checkpoint()`` returns), a
            :class:`Checkpoint`, or a snapshot's path or URL.
        name: with a group, the snapshot's name (``%dist_checkpoint --name warm``).

    Returns:
        The snapshot as a :class:`Checkpoint` (its storage must be reachable from the trials'
        workers, as a group's storage is from its own).

    Raises:
        CheckpointError: no such snapshot, or not one (a reported checkpoint of your own files).

    Example::

        group.checkpoint("warm")                       # or %dist_checkpoint --name warm
        warm = raytrain_nb.tune.warm_start(group, "warm")
    """
    if isinstance(source, WorkerGroup):
        snapshots = source.checkpoints("snapshot")
        if not snapshots:
            raise CheckpointError(f"warm_start: group {source.name!r} has no snapshot: take one with "
                                  "%dist_checkpoint --name warm (group.checkpoint('warm'))")
        if name is None:
            source = snapshots[-1]
        else:
            found = [e for e in snapshots if e.name == name]
            if not found:
                raise CheckpointError(f"warm_start: group {source.name!r} has no snapshot named {name!r} (it has "
                                      f"{', '.join(e.name for e in snapshots)}): pass one of these")
            source = found[0]
    elif name is not None:
        raise ConfigError(f"warm_start: name={name!r} picks a snapshot of a group: pass the group first, "
                          "warm_start(group, name), or the checkpoint alone")
    ckpt = as_checkpoint(source, "warm_start")
    state_files(ckpt.url)
    return ckpt


def _named(objects: Optional[Dict[str, Any]], named: Dict[str, Any], what: str) -> Dict[str, Any]:
    """One ``{variable name: object}`` from the positional dict and the keywords, checked."""
    if objects is not None and not isinstance(objects, dict):
        raise ConfigError(f"{what}: {objects!r} is not a dict of objects by name: pass "
                          f"{what}(..., model=model) or {what}(..., {{\"models['G']\": g}})")
    both = sorted(set(objects or {}) & set(named))
    if both:
        raise ConfigError(f"{what}: {', '.join(both)} given twice (in the dict and as a keyword): give each once")
    merged = {**(objects or {}), **named}
    if not merged:
        raise ConfigError(f"{what}: no objects given: name them as in the notebook, {what}(..., model=model, "
                          "opt=opt)")
    for key, obj in merged.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"{what}: {key!r} is not a variable name: use the name the object has in the "
                              "notebook, e.g. 'model'")
        if kind_of(obj) not in KINDS:
            raise ConfigError(f"{what}: {key}={type(obj).__name__} is not a torch module, optimizer, LR "
                              "scheduler, grad scaler or XGBoost / LightGBM booster; only those are saved by name")
        if is_sharded(obj) or any(is_sharded(p) for g in getattr(obj, "param_groups", ()) for p in g["params"]):
            raise ConfigError(f"{what}: {key} is sharded (FSDP2), so no rank holds it whole: save it with "
                              "torch.distributed.checkpoint on every rank into one directory and report "
                              "Checkpoint.from_directory(d) (Ray's FSDP2 guide); resume with get_checkpoint() + dcp.load")
    return merged


def _saved_names(saved: Dict[str, Any]) -> str:
    names = sorted(f"{n} ({kind[:-1]})" for kind in KINDS for n in saved.get(kind, {}))
    return ", ".join(names) or "nothing"


def load_state(checkpoint: Any, objects: Optional[Dict[str, Any]] = None, /, **named: Any) -> List[str]:
    """Load a checkpoint's saved objects into yours, by variable name, in place.

    The checkpoint is a group's snapshot (``warm_start``) or one written by :func:`save_state`.
    ``model=model`` loads the state saved under ``model`` into ``model`` (a DDP wrapper counts as
    its module, as in snapshots). Every name and shape is checked before anything is loaded.

    An optimizer's state includes its learning rate: to sweep it, set it after loading
    (``for g in opt.param_groups: g["lr"] = config["lr"]``).

    Args:
        checkpoint: what ``get_checkpoint()`` returned (or any path, URL or Checkpoint).
        objects: ``{name: object}`` for names that are no keywords (``{"models['G']": g}``).
        named: ``name=object`` for each torch module, optimizer, LR scheduler, grad scaler or booster
            (XGBoost / LightGBM: the saved model is loaded into that booster, e.g. an empty
            ``xgboost.Booster()``).

    Returns:
        The names loaded.

    Raises:
        CheckpointError: no checkpoint, one without named state, a name it does not hold, or a
            shape that differs (naming it); nothing is loaded then.
        ConfigError: an object that is not a module, optimizer, scheduler, grad scaler or booster.

    Example::

        load_state(raytrain_nb.get_checkpoint(), model=model, opt=opt)
    """
    import torch  # torch: loaded on first use, not on import raytrain_nb

    objs = _named(objects, named, "load_state")
    if checkpoint is None:
        raise CheckpointError("load_state: the checkpoint is None (get_checkpoint() found none): start the "
                              "trainer warm, TorchTrainer(..., resume_from_checkpoint=warm_start(group))")
    ckpt = as_checkpoint(checkpoint, "load_state")
    saved = read_replicated(ckpt.url)
    plan = []
    for key, obj in objs.items():
        kind = kind_of(obj)
        state = saved.get(kind, {}).get(key)
        if state is None:
            raise CheckpointError(f"load_state: checkpoint {ckpt.url} holds no {kind[:-1]} named {key!r} (it has "
                                  f"{_saved_names(saved)}); nothing was loaded: pass the name it was saved under")
        problem = structure_problem(kind, obj, state)
        if problem:
            raise CheckpointError(f"load_state: {key!r} does not fit the one saved in {ckpt.url} ({problem}); "
                                  "nothing was loaded")
        plan.append((obj, kind, state))
    with torch.no_grad():
        for obj, kind, state in plan:
            if kind == "boosters":
                load_into(obj, state)  # the same booster object: references to it stay valid
            else:
                (unwrap(obj) if kind == "modules" else obj).load_state_dict(state)
    logger.debug("load_state: loaded %s from %s", ", ".join(objs), ckpt.url)
    return list(objs)


def save_state(directory: Any, objects: Optional[Dict[str, Any]] = None, /, **named: Any) -> Optional[Checkpoint]:
    """Save objects by variable name into ``directory``, to report as a checkpoint a group can load.

    Writes the snapshot layout (each object's ``state_dict`` under its name), so the trial's
    reported checkpoint loads with ``group.load(...)`` into the group's objects of the same
    names, and with :func:`load_state` anywhere. A DDP wrapper is saved as its module.

    Only rank 0 writes (every rank holds the same state under DDP): other ranks get ``None``,
    which is what they pass to ``report``.

    Args:
        directory: a local directory (e.g. a ``tempfile.TemporaryDirectory()``) or an fsspec URL.
        objects: ``{name: object}`` for names that are no keywords.
        named: ``name=object`` for each torch module, optimizer, LR scheduler, grad scaler or booster
            (saved as its model bytes, as a snapshot saves it).

    Returns:
        ``Checkpoint.from_directory(directory)`` on rank 0 (or outside a worker), else None.

    Raises:
        ConfigError: an object that is not a module, optimizer, scheduler, grad scaler or booster.

    Example::

        with tempfile.TemporaryDirectory() as tmp:
            raytrain_nb.report({"loss": loss}, checkpoint=save_state(tmp, model=model, opt=opt))
    """
    objs = _named(objects, named, "save_state")
    try:
        ctx = get_context()
        rank, world_size = ctx.get_world_rank(), ctx.get_world_size()
    except RuntimeError:  # not on a worker: a plain script or test
        rank, world_size = 0, 1
    if rank != 0:
        return None
    replicated: Dict[str, Dict[str, Any]] = {kind: {} for kind in KINDS}
    for key, obj in objs.items():
        kind = kind_of(obj)
        replicated[kind][key] = model_bytes(obj) if kind == "boosters" else cpu_state(
            (unwrap(obj) if kind == "modules" else obj).state_dict())
    ckpt = Checkpoint.from_directory(directory)
    write_state(ckpt.url, replicated, world_size)
    return ckpt
