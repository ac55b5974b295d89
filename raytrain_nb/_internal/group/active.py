"""Which group the magics use: the latest one started or attached in this process, and not shut down or detached."""
from __future__ import annotations

from typing import Any, Optional

_ACTIVE: Optional[Any] = None


def active_group() -> Optional[Any]:
    """The group the magics use (the latest one started or attached and not shut down or detached), or None."""
    return _ACTIVE


def make_active(group: Any) -> None:
    global _ACTIVE
    _ACTIVE = group


def leave(group: Any) -> None:
    """``group`` is no longer the active one (if it was)."""
    global _ACTIVE
    if _ACTIVE is group:
        _ACTIVE = None
