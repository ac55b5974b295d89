"""The group's lifecycle: its states, a slot's states, and the allowed changes in one table.

Every change of a group's state goes through :meth:`WorkerGroup.transition`, which checks it
against :data:`TRANSITIONS`; a change the table does not list raises :class:`TransitionError`.
Both enums are ``str``-valued, so ``group.state == "idle"`` and ``status()[0].state == "dead"``
hold as they always did.
"""
from __future__ import annotations

import enum
from typing import Dict, FrozenSet

from ..errors import TransitionError


class _StrEnum(str, enum.Enum):
    """An enum whose members are their string values (``str()`` and f-strings show the value)."""

    def __str__(self) -> str:
        return str(self.value)

    __format__ = str.__format__


class GroupState(_StrEnum):
    """Lifecycle of a group; observers subscribe with :meth:`WorkerGroup.subscribe`."""

    STARTING = "starting"
    IDLE = "idle"
    RUNNING = "running"
    FAILED = "failed"
    RECOVERING = "recovering"
    SHUTDOWN = "shut down"


class SlotState(_StrEnum):
    """Lifecycle of one rank's worker (a row of ``status()``)."""

    STARTING = "starting"
    IDLE = "idle"
    RUNNING = "running"
    FAILED = "failed"  # its last cell raised; the worker is alive
    DEAD = "dead"
    UNRESPONSIVE = "unresponsive"

    @property
    def gone(self) -> bool:
        """Dead, or alive but not answering: the rank must be restarted or dropped."""
        return self in (SlotState.DEAD, SlotState.UNRESPONSIVE)


_S = GroupState

#: Every state change a group may make. A starting group runs one function on its workers (the
#: shared-storage check); a failed group may run again once nothing is dead (a failed rescale leaves
#: live workers); a running one may replace a stuck rank.
TRANSITIONS: Dict[GroupState, FrozenSet[GroupState]] = {
    _S.STARTING: frozenset({_S.IDLE, _S.RUNNING, _S.SHUTDOWN}),
    _S.IDLE: frozenset({_S.RUNNING, _S.FAILED, _S.RECOVERING, _S.SHUTDOWN}),
    _S.RUNNING: frozenset({_S.IDLE, _S.FAILED, _S.RECOVERING, _S.SHUTDOWN}),
    _S.FAILED: frozenset({_S.RUNNING, _S.RECOVERING, _S.SHUTDOWN}),
    _S.RECOVERING: frozenset({_S.IDLE, _S.FAILED, _S.SHUTDOWN}),
    _S.SHUTDOWN: frozenset(),
}


def check_transition(old: GroupState, new: GroupState) -> None:
    """Raise unless ``old -> new`` is in :data:`TRANSITIONS` (staying in a state is always allowed).

    Raises:
        TransitionError: naming both states and the allowed ones.
    """
    if old is new or new in TRANSITIONS[old]:
        return
    allowed = ", ".join(sorted(s.value for s in TRANSITIONS[old])) or "none"
    raise TransitionError(f"a group cannot go from {old.value!r} to {new.value!r} (allowed from "
                          f"{old.value!r}: {allowed})")
