"""Ray's implicit ``ray.init()`` starts the same quiet embedded instance ``fit()`` would.

A ported Ray Train script often touches Ray before ``fit()`` (``ray.data.from_items(...)`` puts
objects), which makes Ray start itself with its defaults: worker logs (Ray Data's progress bars)
flood the terminal and ``RAYTRAIN_NB_*`` settings are ignored. Importing the trainer installs a
replacement for Ray's auto-init that calls :func:`~.cluster.connect` instead (``RAY_ADDRESS`` is
still honoured; an explicit ``ray.init(...)`` by the script still wins).
"""
from __future__ import annotations

import logging
import os
import sys

from .. import cluster
from ..lean_entry import defer_iri_grammar

logger = logging.getLogger(__name__)


def install() -> None:
    """Replace ``ray._private.auto_init_hook.auto_init_ray`` once per process (no-op without Ray)."""
    defer_iri_grammar()  # Ray's first import here: without a second spent on jsonschema's IRI grammar
    try:
        from ray._private import auto_init_hook  # ray: loaded when a group or trainer runs, not on import raytrain_nb
    except Exception:  # noqa: BLE001 - Ray missing or its internals moved: keep Ray's own behaviour
        return
    original = auto_init_hook.auto_init_ray
    if getattr(original, "_rtnb", False):
        _install_for_tune()  # Tune may have been loaded since
        return

    def auto_init_ray() -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        if os.environ.get("RAY_ENABLE_AUTO_CONNECT", "") == "0" or ray.is_initialized():
            return original()

        try:
            cluster.connect()
        except Exception as exc:  # noqa: BLE001 - let Ray try its own way, and say why
            logger.warning("starting Ray the raytrain_nb way failed (%s); using ray.init()", exc)
            original()

    auto_init_ray._rtnb = True  # type: ignore[attr-defined]
    auto_init_hook.auto_init_ray = auto_init_ray
    _install_for_tune()
    # Modules that did ``from ray._private.auto_init_hook import auto_init_ray`` hold the original.
    for module in list(sys.modules.values()):
        if getattr(module, "auto_init_ray", None) is original and module is not auto_init_hook:
            try:
                module.auto_init_ray = auto_init_ray
            except Exception:  # noqa: BLE001 - a read-only module: that path keeps Ray's default
                pass


def _install_for_tune() -> None:
    """Ray Tune starts Ray with a plain ``ray.init()`` of its own (``tune.py`` ``_ray_auto_init``) when
    ``Tuner.fit()`` finds it not running: make that start the embedded instance too (Tune already loaded)."""
    tune = sys.modules.get("ray.tune.tune")
    original = getattr(tune, "_ray_auto_init", None)
    if original is None or getattr(original, "_rtnb", False):
        return

    def auto_init_on_our_cluster(entrypoint: str) -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        if os.environ.get("TUNE_DISABLE_AUTO_INIT") != "1" and not ray.is_initialized():
            try:
                cluster.connect()
            except Exception as exc:  # noqa: BLE001 - let Tune try its own way, and say why
                logger.warning("starting Ray the raytrain_nb way failed (%s); Tune calls ray.init()", exc)
        original(entrypoint)

    auto_init_on_our_cluster._rtnb = True  # type: ignore[attr-defined]
    tune._ray_auto_init = auto_init_on_our_cluster
