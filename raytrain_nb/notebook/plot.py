"""The dashboard's metrics plot: matplotlib (Agg, no pyplot) rendered to PNG bytes.

Rendering never touches pyplot's global state, so it is safe on the dashboard's timer thread
while the user draws their own figures.
"""
from __future__ import annotations

import io
from typing import Optional, Sequence

from .dashboard_model import Line

WIDTH_IN, HEIGHT_IN, DPI = 7.2, 2.6, 90


class MetricsPlot:
    """A reusable figure; :meth:`render` returns PNG bytes."""

    def __init__(self) -> None:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure

        self.figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
        FigureCanvasAgg(self.figure)
        self.axes = self.figure.add_subplot(1, 1, 1)
        self.figure.subplots_adjust(left=0.1, right=0.98, top=0.9, bottom=0.2)

    def render(self, lines: Sequence[Line], metric: Optional[str], log: bool = False) -> bytes:
        """Draw ``lines`` of ``metric`` against the step; ``log`` puts the y axis on a log scale."""
        ax = self.axes
        ax.clear()
        ax.set_xlabel("step")
        ax.set_ylabel(metric or "metric")
        ax.grid(True, alpha=0.3)
        drawn = False
        for line in lines:
            pts = [(x, y) for x, y in zip(line.xs, line.ys) if y > 0 or not log]  # log: only y > 0
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], label=line.label, linewidth=1.4)
                drawn = True
        if drawn:
            ax.set_yscale("log" if log else "linear")
            ax.set_title(f"{metric} per step" + (" (log scale)" if log else ""), fontsize=10)
            if len(lines) > 1 or (lines and lines[0].label == "mean"):
                ax.legend(loc="upper right", fontsize=8, frameon=False)
        else:
            ax.set_title("no metrics yet: call raytrain_nb.report({'loss': ...}) in a cell", fontsize=9)
        buf = io.BytesIO()
        self.figure.savefig(buf, format="png", dpi=DPI)
        return buf.getvalue()
