"""Validation helpers shared by every config: each error names the field, the value and the fix."""
from __future__ import annotations

import math
from typing import Any, Dict, Type

from .errors import ConfigError, GroupError, NotSupportedError

PLACEMENT_STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")
BACKENDS = ("gloo", "nccl", "none")


def is_int(value: Any) -> bool:
    """A whole number, not a bool."""
    return isinstance(value, int) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    """An int or float, not a bool and not NaN."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def check_number(field: str, value: Any, flag: str, *, allow_zero: bool,
                 error: Type[Exception] = GroupError) -> float:
    """``value`` if it is a number above 0 (or 0 with ``allow_zero``).

    Raises:
        error: naming ``field``, the value and ``flag`` (e.g. ``--cpus``).
    """
    if not is_number(value):
        raise error(f"{field}={value!r} is not a number: pass e.g. {flag} 1")
    if value < 0 or (value == 0 and not allow_zero):
        least = "0 or more" if allow_zero else "more than 0"
        raise error(f"{field}={value!r} is not allowed: it must be {least} ({flag})")
    return value


def fail(cls: str, field: str, value: Any, why: str) -> None:
    """Raise a :class:`ConfigError` for ``cls(field=value)``, saying why."""
    raise ConfigError(f"{cls}({field}={value!r}): {why}")


def refuse(cls: str, obj: Any, defaults: Dict[str, Any], why: str) -> None:
    """Raise :class:`NotSupportedError` (a ``ConfigError``) for Ray Train arguments set to what cannot be honoured
    here (any value other than ``defaults``)."""
    for field, default in defaults.items():
        value = getattr(obj, field)
        if value != default:
            raise NotSupportedError(f"{cls}({field}={value!r}): {why.format(field=field)} (see the README's list of "
                                    "unsupported Ray Train API)")


def not_supported(what: str, instead: str) -> NotSupportedError:
    """The error for using Ray Train API that exists here by name only: ``what`` names it, ``instead`` the way out."""
    return NotSupportedError(f"{what} is not supported here: {instead} (see the README's list of unsupported Ray "
                             "Train API)")
