"""The driver's half of polling a node's ranks through one of them (``worker/node_poll.py``).

While a cell runs, the driver polls every running rank for output and metrics every 100 ms: at 256 ranks that is
2,560 Ray calls a second from one process. Where a node runs several ranks of a group of at least
:data:`NODE_POLL_MIN_RANKS` running ranks, one of them (the node's lowest running rank) polls the others and sends
every answer back in one reply: the driver's calls per round are one per node. A leader that does not answer, or
a peer whose poll failed, is polled directly in the same round (its death typed by the fan-out as usual).
"""
from __future__ import annotations

import weakref
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Sequence, Tuple

from . import timing
from .fanout import FANOUT, Replies

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

#: A cell on at least this many ranks polls a node's ranks through one of them (fewer: one call per rank).
NODE_POLL_MIN_RANKS = 4

#: Per group: the handles each leader was sent, as {leader rank: (leader actor, ((rank, actor), ...))}.
_SENT: "weakref.WeakKeyDictionary[Any, Dict[int, Tuple[Any, Tuple[Tuple[int, Any], ...]]]]" = (
    weakref.WeakKeyDictionary())


def node_groups(node_of: Dict[int, str], min_ranks: int = NODE_POLL_MIN_RANKS) -> Tuple[Dict[int, List[int]],
                                                                                          List[int]]:
    """``({leader: its node's ranks}, ranks polled directly)`` for ranks on nodes ``node_of`` (rank -> node id):
    a node with two or more of them is polled through its lowest rank, when there are ``min_ranks`` in all."""
    if len(node_of) < min_ranks:
        return {}, sorted(node_of)
    by_node: Dict[str, List[int]] = {}
    for rank in sorted(node_of):
        by_node.setdefault(node_of[rank], []).append(rank)
    groups = {ranks[0]: ranks for ranks in by_node.values() if len(ranks) > 1}
    direct = sorted(ranks[0] for ranks in by_node.values() if len(ranks) == 1)
    return groups, direct


def poll_ranks(core: "GroupCore", ranks: Sequence[int], ask: Callable[[Sequence[int]], Replies]
               ) -> Dict[int, Dict[str, Any]]:
    """Every answer of ``ranks``' polls this round, ``{rank: poll}``; ``ask(ranks)`` polls ranks directly.

    A rank missing from the result was not heard this round (its leader keeps its poll for the next).
    """
    slots = {r: core.slots[r] for r in ranks}
    groups, direct = node_groups({r: str(s.info.get("node_id", "?")) for r, s in slots.items()})
    out: Dict[int, Dict[str, Any]] = {}
    if groups:
        sent = _SENT.setdefault(core, {})
        args: Dict[int, Tuple[List[int], Any]] = {}
        for leader, members in groups.items():
            peers = tuple((r, slots[r].actor) for r in members if r != leader)
            known = sent.get(leader)
            same = known is not None and known[0] is slots[leader].actor and len(known[1]) == len(peers) and all(
                a == b and h is g for (a, h), (b, g) in zip(known[1], peers))
            args[id(slots[leader])] = (members, None if same else dict(peers))
            sent[leader] = (slots[leader].actor, peers)
        leaders = sorted(groups)
        replies = FANOUT.ask([slots[r] for r in leaders], lambda s: s.actor.poll_node.remote(*args[id(s)]),
                             timing.CONTROL_CALL_S, "the running ranks' output (one call per node)", ranks=leaders)
        for reply in replies:
            if not reply.ok:  # the leader did not answer: its node's ranks are asked directly
                sent.pop(reply.rank, None)
                direct.extend(groups[reply.rank])
                continue
            for rank, polled in reply.value.items():
                if "error" in polled:
                    direct.append(rank)
                else:
                    out[rank] = polled
    if direct:
        out.update(ask(sorted(set(direct))).values())
    return out
