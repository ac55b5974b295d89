"""The driver's side of ``raytrain_nb.collective``: what each rank is sent for the collectives of one call.

Rank 0's worker keeps the book of the group's collectives (``worker/collective.py``); the driver numbers its calls
to the group (one round each, so an interrupted cell, a restart or a rescale leaves nothing a later collective
meets), reads the deadline, and hands each worker rank 0's actor handle only when it does not have it yet (a handle
costs about 0.2 ms a call to send, so it is not sent with every cell). While a call runs, :func:`tell_finished` lets
rank 0 know which ranks' calls ended, so a rank waiting for one of them fails at once, naming it.
"""
from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Sequence

from .. import settings
from ..errors import ConfigError
from ..worker.collective import CollectiveSpec
from ..worker.outcome import CellOutcome

logger = logging.getLogger(__name__)


def timeout_s() -> float:
    """The collectives' deadline (``RAYTRAIN_NB_COLLECTIVE_TIMEOUT_S``), read at each call.

    Raises:
        ConfigError: not a positive number (naming the value and the fix).
    """
    try:
        return settings.collective_timeout_s()
    except ValueError as exc:
        raise ConfigError(str(exc)) from None


class CollectiveRounds:
    """Per group: the rounds of its calls, and which workers hold the handle of the current rank 0's worker."""

    def __init__(self) -> None:
        self._round = 0
        self._token = 0
        self._coordinator: Any = None
        self._holders: Dict[Any, int] = {}  # worker handle -> the token of the rank 0 it was given

    def specs(self, actors: Sequence[Any], targets: Sequence[int]) -> List[CollectiveSpec]:
        """One spec per target (rank) of a new call; ``actors`` are the group's workers in rank order."""
        deadline = timeout_s()
        self._round += 1
        if self._coordinator is None or actors[0] != self._coordinator:
            self._coordinator, self._token = actors[0], self._token + 1
            self._holders = {}
        elif len(self._holders) > len(actors):  # workers replaced since: forget them
            self._holders = {a: t for a, t in self._holders.items() if a in actors}
        out = []
        for rank in targets:
            actor = actors[rank]
            give = rank != 0 and self._holders.get(actor) != self._token
            if give:
                self._holders[actor] = self._token
            out.append(CollectiveSpec(self._round, len(actors), deadline, self._token,
                                      self._coordinator if give else None))
        return out


def tell_finished(rank0: Any, results: Mapping[int, CellOutcome], waiting: Mapping[int, Any],
                  told: set) -> None:
    """While a call runs: ranks wait in a collective (``waiting``: rank -> the key each polled) and the call ended on
    other ranks (``results``, those not ``told`` yet): tell rank 0's worker (``rank0``), which ends those waits
    naming the ranks that will not come. Best effort: a rank 0 that is gone is the call's own error."""
    keys = [key for key in waiting.values() if key]
    ended = {r: res.failure is not None for r, res in results.items() if r not in told}
    if not keys or not ended or (0 in results and results[0].dead):
        return
    told.update(ended)
    try:
        rank0.collective_finished.remote(keys[0][0], ended)
    except Exception as exc:  # noqa: BLE001 - rank 0's worker died meanwhile: its death ends the call
        logger.debug("telling rank 0 which ranks finished failed: %s", exc)
