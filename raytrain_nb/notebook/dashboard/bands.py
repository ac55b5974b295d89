"""A large group's plot as one band: at each step the ranks' mean, minimum and maximum, kept as reports arrive.

A line per rank is unreadable beyond a few dozen ranks and costs a render time in proportion to every point of
every rank. :class:`Bands` folds each report into a per-step count, sum, minimum and maximum when it arrives
(O(metrics) per report), so drawing the plot costs the same at 256 ranks as at 2: the mean line and a min-max band.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Dict, List, Optional

@dataclasses.dataclass
class Line:
    """One line of the plot; ``lo`` and ``hi`` (when given) bound a band drawn around it."""

    label: str
    xs: List[float]
    ys: List[float]
    lo: Optional[List[float]] = None
    hi: Optional[List[float]] = None


#: A step's figures: [ranks counted, sum, minimum, maximum].
_N, _SUM, _LO, _HI = 0, 1, 2, 3


class Bands:
    """Per metric, per step: how many ranks reported it, their sum, minimum and maximum (not thread-safe: the
    dashboard model's lock covers it).

    Args:
        max_points: steps kept per metric; beyond that the older half is thinned (every other step dropped).
    """

    def __init__(self, max_points: int) -> None:
        self.max_points = max_points
        self.steps: Dict[str, Dict[float, List[float]]] = {}

    def add(self, x: float, values: Dict[str, float]) -> None:
        """Fold one rank's finite ``values`` at step ``x`` in."""
        for key, value in values.items():
            per_step = self.steps.get(key)
            if per_step is None:
                per_step = self.steps[key] = {}
            cell = per_step.get(x)
            if cell is None:
                per_step[x] = [1, value, value, value]
                if len(per_step) > self.max_points:
                    self._thin(per_step)
            else:
                cell[_N] += 1
                cell[_SUM] += value
                if value < cell[_LO]:
                    cell[_LO] = value
                if value > cell[_HI]:
                    cell[_HI] = value

    @staticmethod
    def _thin(per_step: Dict[float, List[float]]) -> None:
        xs = sorted(per_step)
        half = len(xs) // 2
        for x in xs[1:half:2]:
            del per_step[x]

    def line(self, metric: str, ranks: int, plot_points: int) -> Optional[Line]:
        """The mean of ``metric`` with its min-max band, at most ``plot_points`` steps (sampled evenly, the last
        one always), or None when no rank reported it."""
        per_step = self.steps.get(metric)
        if not per_step:
            return None
        xs = sorted(per_step)
        stride = max(1, math.ceil(len(xs) / plot_points))
        kept = xs[::stride]
        if kept[-1] != xs[-1]:
            kept.append(xs[-1])
        cells = [per_step[x] for x in kept]
        return Line(f"mean of {ranks} ranks (band: min-max)", kept, [c[_SUM] / c[_N] for c in cells],
                    lo=[c[_LO] for c in cells], hi=[c[_HI] for c in cells])
