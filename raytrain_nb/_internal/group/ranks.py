"""Rank assignment: which worker gets which world, local and node rank."""
from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence


@dataclasses.dataclass(frozen=True)
class RankInfo:
    """The rank variables of one worker."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int

    def context(self, experiment_name: str = "") -> Dict[str, Any]:
        return dict(dataclasses.asdict(self), experiment_name=experiment_name)

    def env(self, master_addr: str, master_port: int) -> Dict[str, str]:
        return {
            "RANK": str(self.world_rank),
            "WORLD_SIZE": str(self.world_size),
            "LOCAL_RANK": str(self.local_rank),
            "LOCAL_WORLD_SIZE": str(self.local_world_size),
            "NODE_RANK": str(self.node_rank),
            "MASTER_ADDR": master_addr,
            "MASTER_PORT": str(master_port),
        }


def assign_ranks(node_ids: Sequence[str], driver_node: Optional[str] = None) -> List[int]:
    """Order workers so ranks on one node are contiguous, the driver's node first.

    Args:
        node_ids: the node of each worker, in spawn order.
        driver_node: the driver's node id; its workers get the lowest ranks.

    Returns:
        ``order`` such that worker ``order[r]`` gets world rank ``r``.
    """
    nodes: List[str] = []
    for node in node_ids:
        if node not in nodes:
            nodes.append(node)
    if driver_node in nodes:
        nodes.remove(driver_node)
        nodes.insert(0, driver_node)
    return [i for node in nodes for i, n in enumerate(node_ids) if n == node]


def rank_infos(node_ids_by_rank: Sequence[str]) -> List[RankInfo]:
    """Rank variables for workers already ordered by rank."""
    nodes: List[str] = []
    for node in node_ids_by_rank:
        if node not in nodes:
            nodes.append(node)
    counts: Dict[str, int] = {n: 0 for n in nodes}
    out = []
    world = len(node_ids_by_rank)
    for rank, node in enumerate(node_ids_by_rank):
        out.append(RankInfo(rank, world, counts[node], node_ids_by_rank.count(node), nodes.index(node)))
        counts[node] += 1
    return out
