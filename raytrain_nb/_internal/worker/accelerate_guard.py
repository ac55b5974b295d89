"""On CPU workers, refuse Accelerate's FSDP and DeepSpeed plugins in one line when an ``Accelerator`` is made."""
from __future__ import annotations

import functools
import importlib.abc
import inspect
import os
import sys
from typing import Any, Dict, Mapping, Optional, Sequence

from ..errors import NotSupportedError

#: The module defining ``Accelerator``; its ``__init__`` is wrapped once the module has run.
MODULE = "accelerate.accelerator"

#: How to shard a model over the group instead (what every refusal names).
FSDP2 = "shard with prepare_model(model, parallel_strategy='fsdp2') (raytrain_nb.torch)"

#: Whether this worker's device is the CPU (set by :func:`install`; read at every ``Accelerator()``).
_STATE: Dict[str, bool] = {"cpu": False}


def _env_on(env: Mapping[str, str], name: str) -> bool:
    """Accelerate's own reading of a switch: the variable is ``true`` in any case."""
    return env.get(name, "false").lower() == "true"


def _plugin_text(field: str, plugin: Any) -> str:
    """``field=TypeName(fsdp_version=2)`` (or ``field=TypeName``): the argument as the user wrote it, short."""
    name = type(plugin).__name__
    if isinstance(plugin, dict):  # deepspeed_plugins={"name": DeepSpeedPlugin(...)}
        name = "{" + ", ".join(f"{k!r}: {type(v).__name__}" for k, v in plugin.items()) + "}"
    version = getattr(plugin, "fsdp_version", None)
    return f"{field}={name}(fsdp_version={version})" if version is not None else f"{field}={name}"


def cpu_sharding_problem(arguments: Mapping[str, Any], env: Mapping[str, str]) -> Optional[str]:
    """The one-line refusal for ``Accelerator(**arguments)`` made on a CPU worker with ``env``, or None if fine.

    Accelerate turns its FSDP plugin into ``DistributedType.FSDP`` only on accelerators: on the CPU the state
    stays ``MULTI_CPU`` and the model is not sharded (a later ``prepare`` fails on a missing ``fsdp_plugin``).
    Its DeepSpeed plugin is not a way raytrain_nb shards either. Both are named with FSDP2, the way that does.
    """
    fsdp = arguments.get("fsdp_plugin")
    if fsdp is not None or _env_on(env, "ACCELERATE_USE_FSDP"):
        what = f"Accelerator({_plugin_text('fsdp_plugin', fsdp)})" if fsdp is not None else "ACCELERATE_USE_FSDP=true"
        return (f"{what}: Accelerate ignores its FSDP plugin on CPU: {FSDP2}, or run on GPUs (--gpus 1, "
                "ScalingConfig(use_gpu=True))")
    for field in ("deepspeed_plugin", "deepspeed_plugins"):
        if arguments.get(field) is not None:
            return (f"Accelerator({_plugin_text(field, arguments[field])}): DeepSpeed is not supported by "
                    f"raytrain_nb on CPU: {FSDP2}")
    if _env_on(env, "ACCELERATE_USE_DEEPSPEED"):
        return f"ACCELERATE_USE_DEEPSPEED=true: DeepSpeed is not supported by raytrain_nb on CPU: {FSDP2}"
    return None


def _arguments(signature: inspect.Signature, args: Sequence[Any], kwargs: Mapping[str, Any]) -> Dict[str, Any]:
    """``Accelerator.__init__``'s arguments by name (``signature`` is its own), positional ones included."""
    try:
        bound = signature.bind_partial(None, *args, **kwargs)
    except TypeError:  # a wrong call: Accelerate itself says what is wrong with it
        return dict(kwargs)
    return dict(bound.arguments)


def guard(cls: Any) -> None:
    """Wrap ``cls.__init__`` (Accelerate's ``Accelerator``) with the check, once; a no-op on a wrapped class."""
    init = cls.__init__
    if getattr(init, "_rtnb_guarded", False):
        return
    signature = inspect.signature(init)

    @functools.wraps(init)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        if _STATE["cpu"]:
            problem = cpu_sharding_problem(_arguments(signature, args, kwargs), os.environ)
            if problem:
                raise NotSupportedError(problem)
        init(self, *args, **kwargs)

    __init__._rtnb_guarded = True  # type: ignore[attr-defined]
    cls.__init__ = __init__


class _GuardingLoader(importlib.abc.Loader):
    """The real loader of ``accelerate.accelerator``, guarding ``Accelerator`` once the module has run."""

    def __init__(self, loader: Any) -> None:
        self.loader = loader

    def create_module(self, spec: Any) -> Any:
        return self.loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.loader.exec_module(module)
        if hasattr(module, "Accelerator"):
            guard(module.Accelerator)

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename...: the real loader's
        if name == "loader":  # not set yet (a copy being made): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


class AccelerateFinder(importlib.abc.MetaPathFinder):
    """A ``sys.meta_path`` entry that finds only ``accelerate.accelerator``, through the finders after it, and
    hands back its spec with a loader that guards ``Accelerator`` (nothing is imported before the user does)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != MODULE:
            return None
        finders = sys.meta_path[sys.meta_path.index(self) + 1:] if self in sys.meta_path else sys.meta_path
        for finder in finders:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _GuardingLoader(spec.loader)
                return spec
        return None


def install(cpu: bool) -> None:
    """Guard ``Accelerator()`` in this process: refuse FSDP and DeepSpeed plugins when ``cpu`` (the worker's
    device is the CPU). On a GPU worker nothing is installed (and a check installed before passes everything).
    Idempotent; called at every setup.

    ``Accelerator`` is wrapped at once if Accelerate is already imported, else when it is first imported.
    """
    _STATE["cpu"] = bool(cpu)
    if not cpu:
        return
    module = sys.modules.get(MODULE)
    if module is not None and hasattr(module, "Accelerator"):
        guard(module.Accelerator)
    elif not any(isinstance(finder, AccelerateFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, AccelerateFinder())
