"""A node's ranks polled through one of them: the driver makes one poll call per node, not one per rank.

The driver asks one rank of a node (its leader) with ``Worker.poll_node(ranks, handles)``; the leader polls
the other ranks of its node through their actor handles (calls between processes of one machine), polls
itself, and returns every answer in one reply. Handles are sent once and kept (``handles=None`` afterwards).
A peer whose poll failed comes back as ``{"error": ...}``, and the driver polls that rank itself, where a death
is typed as usual.
"""
from __future__ import annotations

import threading
from typing import Any, Callable, Dict, Optional, Sequence

#: How long the leader waits for its peers' polls: as long as the driver's own fan-out would (under its deadline).
PEER_WAIT_S = 4.0


class NodePeers:
    """The handles of a leader's node peers (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.handles: Dict[int, Any] = {}

    def poll(self, own_rank: int, own_poll: Callable[[], Dict[str, Any]], ranks: Sequence[int],
             handles: Optional[Dict[int, Any]], wait_s: float = PEER_WAIT_S) -> Dict[int, Dict[str, Any]]:
        """Poll ``ranks`` (this rank among them, through ``own_poll``) and return ``{rank: poll}``.

        A peer that did not answer within ``wait_s`` is missing from the result (as a late rank is from the
        driver's own fan-out); one whose poll failed is ``{"error": ...}``.
        """
        import ray  # ray: inside a worker process, where it is loaded already

        with self._lock:
            if handles is not None:
                self.handles = dict(handles)
            refs = {r: self.handles[r].poll.remote() for r in ranks if r != own_rank and r in self.handles}
        out: Dict[int, Dict[str, Any]] = {}
        if own_rank in ranks:
            out[own_rank] = own_poll()
        if refs:
            ready, _ = ray.wait(list(refs.values()), num_returns=len(refs), timeout=wait_s)
            done = set(ready)
            for rank, ref in refs.items():
                if ref not in done:
                    continue
                try:
                    out[rank] = ray.get(ref, timeout=wait_s)
                except Exception as exc:  # noqa: BLE001 - the driver polls this rank itself and types it
                    out[rank] = {"error": f"{type(exc).__name__}: {(str(exc).splitlines() or [''])[0]}"}
        for rank in ranks:  # a rank this leader holds no handle of: the driver polls it
            if rank != own_rank and rank not in refs:
                out[rank] = {"error": "not a peer of this leader"}
        return out
