"""The dashboard's metrics plot: matplotlib (Agg, no pyplot) rendered to PNG bytes, cheaply.

Drawing a whole figure costs ~30-60 ms of CPU, taken from training on a small machine. So the
axes, ticks, labels and legend are drawn only when they change (another metric or scale, new
lines, or data beyond the limits: the step axis then doubles, the metric axis grows by half;
a handful of times per run); every
other frame restores that background and draws just the lines (blitting), then encodes the PNG
as a palette image with fast compression. A line with bounds (a large group's mean) gets its min-max band
drawn under it. Rendering never touches pyplot's global state, so it is safe on the
dashboard's timer thread while the user draws their own figures.
"""
from __future__ import annotations

import io
import math
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .model import Line

WIDTH_IN, HEIGHT_IN, DPI = 7.2, 2.6, 90
GROWTH = 1.5  # the metric axis grows by this factor when data leaves it (the step axis doubles)
PALETTE_COLOURS = 128
MAX_LEGEND = 12  # more lines than this: no legend (it would cover the plot)
EMPTY_TITLE = "no metrics yet: call raytrain_nb.report({'loss': ...}) in a cell"


def _style(label: str, highlight: Optional[str]) -> Dict[str, Any]:
    """A line's width (and fading): with a ``highlight``, that line thick on top and the others faded."""
    if highlight is None:
        return {"linewidth": 1.4}
    return {"linewidth": 2.8, "zorder": 3} if label == highlight else {"linewidth": 1.0, "alpha": 0.55}


def _grow_steps(lo: float, hi: float, data_lo: float, data_hi: float) -> Tuple[float, float]:
    """The step axis: from the first step, doubling its end whenever the steps pass it."""
    if hi <= lo or data_lo < lo:
        lo = data_lo
    if data_hi > hi or hi <= lo:
        hi = lo + max((data_hi - lo) * 2, 10.0)
    return lo, hi


def _grow(lo: float, hi: float, data_lo: float, data_hi: float, log: bool) -> Tuple[float, float]:
    """Limits that contain ``[data_lo, data_hi]``, with room to grow (multiplicative on a log axis)."""
    if log:
        if lo <= 0 or data_lo < lo:
            lo = data_lo / GROWTH
        if data_hi > hi:
            hi = data_hi * GROWTH
        return lo, hi
    span = max(data_hi - data_lo, abs(data_hi) * 0.1, 1e-9)
    if data_lo < lo:
        lo = data_lo - span * (GROWTH - 1) / 2
    if data_hi > hi:
        hi = data_hi + span * (GROWTH - 1) / 2
    return lo, hi


class MetricsPlot:
    """A reusable figure; :meth:`render` returns PNG bytes. ``full_draws`` counts the slow frames."""

    def __init__(self) -> None:
        # matplotlib: optional or heavy, loaded on first use
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure  # matplotlib: optional or heavy, loaded on first use

        self.figure = Figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
        self.canvas = FigureCanvasAgg(self.figure)
        self.axes = self.figure.add_subplot(1, 1, 1)
        self.figure.subplots_adjust(left=0.1, right=0.98, top=0.9, bottom=0.2)
        self._lines: Dict[str, Any] = {}
        self._layout: Optional[Tuple[Any, ...]] = None
        self._xlim = (0.0, 0.0)
        self._ylim = (0.0, 0.0)
        self._background: Any = None
        self.full_draws = 0

    def render(self, lines: Sequence[Line], metric: Optional[str], log: bool = False,
               highlight: Optional[str] = None, xlabel: str = "step", empty_title: str = EMPTY_TITLE) -> bytes:
        """Draw ``lines`` of ``metric`` against the step; ``log`` puts the y axis on a log scale.

        ``highlight``: the label of a line drawn thick over thin, faded others (the sweep's best trial);
        ``xlabel``: what the x axis counts; ``empty_title``: the title while there is nothing to draw.
        """
        data = [(ln.label, [(x, y) for x, y in zip(ln.xs, ln.ys) if y > 0 or not log]) for ln in lines]
        data = [(label, pts) for label, pts in data if pts]
        bands = [(ln.label, [(x, lo, hi) for x, lo, hi in zip(ln.xs, ln.lo, ln.hi) if lo > 0 or not log])
                 for ln in lines if ln.lo is not None and ln.hi is not None]
        layout = (metric, log, tuple(label for label, _ in data), highlight, xlabel, empty_title)
        if data:
            xs = [x for _, pts in data for x, _ in pts]
            ys = [y for _, pts in data for _, y in pts] + [v for _, pts in bands for p in pts for v in p[1:]]
            xlim = _grow_steps(*(self._xlim if layout == self._layout else (0.0, 0.0)), min(xs), max(xs))
            ylim = _grow(*(self._ylim if layout == self._layout else (math.inf, -math.inf)), min(ys), max(ys), log)
        else:
            xlim, ylim = (0.0, 1.0), (0.0, 1.0)
        if layout != self._layout or xlim != self._xlim or ylim != self._ylim or self._background is None:
            self._draw_background(layout, data, xlim, ylim, metric, log)
        else:
            self.canvas.restore_region(self._background)
        for label, pts in bands:  # a large group's min-max band, under its mean line
            if pts and label in self._lines:
                band = self.axes.fill_between([p[0] for p in pts], [p[1] for p in pts], [p[2] for p in pts],
                                              color=self._lines[label].get_color(), alpha=0.25, linewidth=0,
                                              animated=True)
                self.axes.draw_artist(band)
                band.remove()
        for label, pts in data:
            line = self._lines[label]
            line.set_data([p[0] for p in pts], [p[1] for p in pts])
            self.axes.draw_artist(line)
        return self._png()

    def _draw_background(self, layout: Tuple[Any, ...], data: List[Tuple[str, List[Tuple[float, float]]]],
                         xlim: Tuple[float, float], ylim: Tuple[float, float], metric: Optional[str],
                         log: bool) -> None:
        ax = self.axes
        if layout != self._layout:
            ax.clear()
            ax.locator_params(nbins=5)  # fewer tick labels: each one costs drawing time
            ax.set_xlabel(layout[4])
            ax.set_ylabel(metric or "metric")
            ax.grid(True, alpha=0.3)
            self._lines = {label: ax.plot([], [], label=label, animated=True, **_style(label, layout[3]))[0]
                           for label, _ in data}
            if data:
                ax.set_yscale("log" if log else "linear")
                ax.set_title(f"{metric} per {layout[4]}" + (" (log scale)" if log else ""), fontsize=10)
                if (len(data) > 1 or data[0][0].startswith("mean")) and len(data) <= MAX_LEGEND:
                    ax.legend(loc="upper right", fontsize=8, frameon=False)
            else:
                ax.set_title(layout[5], fontsize=9)
        ax.set_xlim(*xlim)
        ax.set_ylim(*ylim)
        self.canvas.draw()  # everything but the (animated) lines
        self._background = self.canvas.copy_from_bbox(self.figure.bbox)
        self._layout, self._xlim, self._ylim = layout, xlim, ylim
        self.full_draws += 1

    def _png(self) -> bytes:
        from PIL import Image  # PIL: optional or heavy, loaded on first use

        width, height = self.canvas.get_width_height()
        image = Image.frombuffer("RGBA", (width, height), self.canvas.buffer_rgba(), "raw", "RGBA", 0, 1)
        # A 128-colour palette image: half the encoding time of RGBA and a third of the bytes sent to
        # the front end each frame; a plot has a few line colours, greys and their anti-aliasing.
        image = image.convert("RGB").quantize(colors=PALETTE_COLOURS, method=Image.Quantize.FASTOCTREE)
        buf = io.BytesIO()
        image.save(buf, format="png", compress_level=1)
        return buf.getvalue()
