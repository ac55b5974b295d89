"""What the magics share: parsing ``--ranks``, finding the live group, and turning a group's errors
into one-line ``UsageError``s."""
from __future__ import annotations

from typing import Any, List, Optional

from IPython.core.error import UsageError

from .._internal.errors import RaytrainNbError, WorkerError
from .._internal.group.group import WorkerGroup, active_group
from .._internal.group.state import GroupState


def parse_ranks(text: Optional[str]) -> Optional[List[int]]:
    """``--ranks 0,2`` as a list of ints (None when not given)."""
    if not text:
        return None
    try:
        return [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--ranks {text!r} is not a list of ranks: write e.g. --ranks 0,2") from None


def need_group() -> WorkerGroup:
    """The group the magics act on.

    Raises:
        UsageError: no group was started, or it was shut down.
    """
    group = active_group()
    if group is None or group.state is GroupState.SHUTDOWN:
        raise UsageError("no distributed group yet: run a %%distributed cell first (it starts the workers)")
    return group


def call(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """Call a group method; its errors become one-line UsageErrors (worker tracebacks stay)."""
    try:
        return fn(*args, **kwargs)
    except WorkerError:
        raise
    except RaytrainNbError as exc:
        raise UsageError(str(exc)) from None
