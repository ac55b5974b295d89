"""Durations as users write them (``90``, ``90s``, ``30m``, ``2h``, ``1d``) turned into seconds, and back."""
from __future__ import annotations

import re
from typing import Union

from .errors import ConfigError

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_FORM = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*([smhd]?)\s*$", re.IGNORECASE)


def parse_duration(value: Union[str, float, int, None], what: str = "keep_alive") -> float:
    """Seconds from ``value`` (a number of seconds, or text with a unit s, m, h or d); None is 0.

    Raises:
        ConfigError: not a duration of 0 or more, naming the value and how to write one.
    """
    if value is None:
        return 0.0
    if isinstance(value, bool):
        raise ConfigError(f"{what}={value!r} is not a duration: give seconds or text such as '30m', '2h'")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        match = _FORM.match(str(value))
        if not match:
            raise ConfigError(f"{what}={value!r} is not a duration: write e.g. 90, 90s, 30m, 2h or 1d")
        seconds = float(match.group(1)) * _UNITS[match.group(2).lower()]
    if not seconds >= 0 or seconds == float("inf"):
        raise ConfigError(f"{what}={value!r} is not a duration of 0 or more: write e.g. 90, 30m or 2h (0: none)")
    return seconds


def format_duration(seconds: float) -> str:
    """``seconds`` as short text: ``45 s``, ``12 min``, ``3.5 h``, ``2.0 d``."""
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 172800:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
