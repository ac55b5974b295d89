"""Reserve resources for a group: feasibility check at once, then a placement group with a timeout."""
from __future__ import annotations

import logging
from typing import Any, Dict, List

from .config import GroupConfig
from .errors import ResourceError

logger = logging.getLogger(__name__)


def _fmt(res: Dict[str, float]) -> str:
    """Resources as text, without the per-placement-group bookkeeping entries Ray adds."""
    shown = {k: v for k, v in res.items() if "_group_" not in k and not k.startswith(("node:", "bundle_group"))}
    return ", ".join(f"{v:g} {k}" for k, v in sorted(shown.items())) or "nothing"


def check_feasible(config: GroupConfig, count: int, total: Dict[str, float],
                   node_totals: List[Dict[str, float]]) -> None:
    """Fail at once when the cluster could never place ``count`` workers.

    Raises:
        ResourceError: naming what was asked and what the cluster has.
    """
    bundle = config.bundle()
    for key, per in bundle.items():
        need = per * count
        have = total.get(key, 0.0)
        if need > have + 1e-9:
            flag = {"CPU": "--cpus", "GPU": "--gpus"}.get(key, "resources_per_worker")
            raise ResourceError(
                f"{count} workers x {per:g} {key} = {need:g} {key} asked, but the cluster has {have:g} {key}: "
                f"use fewer workers or a smaller {flag}"
            )
    if node_totals and not any(all(n.get(k, 0.0) + 1e-9 >= v for k, v in bundle.items()) for n in node_totals):
        raise ResourceError(f"one worker asks for {_fmt(bundle)}, more than any single node has")


def check_cluster(config: GroupConfig, count: int) -> None:
    """:func:`check_feasible` against the connected Ray cluster."""
    import ray

    nodes = [n.get("Resources", {}) for n in ray.nodes() if n.get("Alive")]
    check_feasible(config, count, ray.cluster_resources(), nodes)


def reserve(config: GroupConfig, count: int, timeout_s: float) -> Any:
    """Create a ready placement group of ``count`` bundles, or raise within ``timeout_s``.

    Raises:
        ResourceError: the resources did not become free in time (names what is free).
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    check_cluster(config, count)
    bundle = config.bundle() or {"CPU": 0.001}
    pg = placement_group([dict(bundle) for _ in range(count)], strategy=config.placement_strategy)
    ready, _ = ray.wait([pg.ready()], timeout=timeout_s)
    if not ready:
        free = ray.available_resources()
        remove_placement_group(pg)
        raise ResourceError(
            f"{count} workers x ({_fmt(bundle)}) could not be placed within {timeout_s:g} s "
            f"(strategy {config.placement_strategy}); free now: {_fmt(free)}. Other groups or tasks "
            "hold the rest: shut them down, or ask for fewer workers/resources"
        )
    return pg
