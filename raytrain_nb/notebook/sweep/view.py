"""The sweep dashboard's widget: one row per trial, every trial's curve on one plot, Stop buttons.

Stock ipywidgets and matplotlib (the group dashboard's :class:`~..dashboard.plot.MetricsPlot`, with the
best trial's curve drawn thick on top). Tune's loop only writes the :class:`~.model.SweepModel`; the
widgets follow on this view's timer thread, at most every ``refresh_s`` (rows, title, buttons) and
``plot_interval_s`` (the plot, only when a point was added), so a fast-reporting sweep does not flood
the front end. Each button makes one call (:mod:`.actions`) and shows its result in the status line.
"""
from __future__ import annotations

import html
import logging
import threading
import time
from typing import Any, Callable, Dict, Optional

import ipywidgets as w

from ..._internal.waits import join_within
from .actions import LABELS, act
from .model import StopSituation, SweepModel, stop_state, sweep_stop_state
from .rows import TrialRowWidgets, header_row, row_texts, set_if_changed
from .stopper import DashboardStopper

logger = logging.getLogger(__name__)

#: How long :meth:`SweepView.finish` waits for the timer thread's current frame.
FINISH_S = 10.0


class SweepView:
    """The live widget of a sweep; display :attr:`widget` (or the view itself).

    Args:
        model: what to show.
        stopper: what the Stop buttons call.
        situation: returns whether the Stop buttons can act now.
        plot_interval_s: the plot is re-rendered at most this often (and only when it changed).
        refresh_s: rows, title and buttons follow the model this often.

    Attributes:
        rows: ``{trial_id: TrialRowWidgets}``; each has a ``stop`` Button.
        stop_sweep: the Stop sweep button.
        image: the plot (PNG). ``log``: the log-scale checkbox. ``status``: the line that shows each
        button's result or error.
    """

    def __init__(self, model: SweepModel, stopper: DashboardStopper, situation: Callable[[], StopSituation],
                 *, plot_interval_s: float = 1.0, refresh_s: float = 0.5) -> None:
        self.model = model
        self.stopper = stopper
        self.situation = situation
        self.plot_interval_s = plot_interval_s
        self.refresh_s = refresh_s
        self.renders = 0
        self._lock = threading.RLock()
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._plotted: Any = None
        self._plotted_at = 0.0
        self.plot: Any = None
        self._metric: Optional[str] = None
        self._header: Optional[w.HBox] = None
        self._thread: Optional[threading.Thread] = None
        self.rows: Dict[str, TrialRowWidgets] = {}
        self.title = w.HTML()
        self.rows_box = w.VBox([], layout=w.Layout(max_height="330px", overflow="auto"))
        self.rows_box.add_class("rtnb-trials")
        self.image = w.Image(format="png", layout=w.Layout(width="648px", height="234px"))
        self.image.add_class("rtnb-sweep-plot")
        self.log = w.Checkbox(value=True, description="log scale", indent=False)
        self.log.observe(lambda _change: self.poke(), names="value")
        self.stop_sweep = w.Button(description=LABELS["stop_sweep"], icon="stop", button_style="danger",
                                   layout=w.Layout(width="auto"))
        self.stop_sweep.add_class("rtnb-stop-sweep")
        self.stop_sweep.on_click(lambda _button: self._click(None))
        self.status = w.HTML(value="")
        self.status.add_class("rtnb-status")
        self.widget = w.VBox([
            self.title, self.rows_box, w.HBox([self.image, w.VBox([self.log], layout=w.Layout(padding="8px"))]),
            w.HBox([self.stop_sweep, self.status], layout=w.Layout(align_items="center")),
        ], layout=w.Layout(border="1px solid #ddd", padding="6px", width="100%"))
        self.widget.add_class("rtnb-sweep")
        self.refresh()

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    # -- following the model ---------------------------------------------------------------------

    def start(self) -> None:
        """A sweep starts: follow the model on the timer thread until :meth:`finish`."""
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="rtnb-sweep-view", daemon=True)
            self._thread.start()

    def poke(self) -> None:
        """Something changed that should show soon (a trial's state, a click)."""
        self._wake.set()

    def finish(self) -> None:
        """The sweep ended: stop the timer and show the final state (rows, buttons and plot)."""
        self._stop.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            if not join_within(thread, FINISH_S, "the sweep dashboard's last frame", logger):
                logger.warning("the sweep dashboard's timer did not stop within %.0f s", FINISH_S)
        self.refresh()
        self.render(force=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            self._wake.wait(self.refresh_s)
            self._wake.clear()
            if self._stop.is_set():
                break
            try:
                self.refresh()
                if time.monotonic() - self._plotted_at >= self.plot_interval_s:
                    self.render()
            except Exception:  # noqa: BLE001 - the timer must go on
                logger.exception("sweep dashboard update failed")

    def refresh(self) -> None:
        """Rows, title and buttons from the model (only changed traits are sent)."""
        situation = self.situation()
        model = self.model
        with model.lock:  # read the model in one go; Tune's thread waits for this lock, never for widgets
            ids = list(model.rows)
            best = model.best_trial()
            texts = {tid: row_texts(row, model, tid == best, stop_state(model, row, situation))
                     for tid, row in model.rows.items()}
            sweep_button = sweep_stop_state(model, situation)
            metric, mode, scope, running, summary = model.metric, model.mode, model.scope, model.running, model.summary()
        with self._lock:
            if self._header is None or metric != self._metric:
                self._metric, self._header = metric, header_row(metric or "metric")
            for tid in set(self.rows) - set(ids):
                del self.rows[tid]
            for tid in ids:
                if tid not in self.rows:
                    self.rows[tid] = TrialRowWidgets(tid, self._click)
            wanted = (self._header,) + tuple(self.rows[tid].box for tid in ids)
            if tuple(self.rows_box.children) != wanted:
                self.rows_box.children = wanted
            for tid in ids:
                self.rows[tid].update(texts[tid])
            set_if_changed(self.stop_sweep, "disabled", not sweep_button[0])
            set_if_changed(self.stop_sweep, "tooltip", sweep_button[1])
            ranked = f" · ranked by {html.escape(metric)} ({mode}, {scope})" if metric else ""
            state = "running" if running else "ended"
            set_if_changed(self.title, "value", f"<b>raytrain_nb sweep</b> · {html.escape(summary)} · {state}{ranked}")

    def render(self, force: bool = False) -> bool:
        """Draw the plot again if a point was added (or ``force``); returns whether it drew."""
        key = (self.model.version, self.log.value)
        if key == self._plotted and not force:
            return False
        lines, best = self.model.lines()
        if not lines and not force:
            return False
        if self.plot is None:
            from ..dashboard.plot import MetricsPlot  # matplotlib: only once the plot is first drawn

            self.plot = MetricsPlot()
        png = self.plot.render(lines, self.model.metric, log=self.log.value, highlight=best,
                                xlabel="training_iteration",
                                empty_title="no results yet: trials report with tune.report({'loss': ...})")
        with self._lock:
            self.image.value = png
            self._plotted, self._plotted_at = key, time.monotonic()
            self.renders += 1
        return True

    # -- buttons ---------------------------------------------------------------------------------

    def _click(self, trial_id: Optional[str]) -> None:
        try:
            self.press(trial_id)
        except Exception:  # a handler never raises into the kernel log unseen
            logger.exception("sweep dashboard: Stop %s failed", trial_id or "sweep")

    def press(self, trial_id: Optional[str] = None) -> str:
        """What a click on a trial's Stop (or, with None, on Stop sweep) does; returns the line shown."""
        label = LABELS["stop_sweep"] if trial_id is None else f"{LABELS['stop']} {trial_id}"
        situation = self.situation()
        with self.model.lock:
            row = self.model.rows.get(trial_id) if trial_id is not None else None
            if trial_id is None:
                enabled, why = sweep_stop_state(self.model, situation)
            elif row is None:
                enabled, why = False, "no such trial in this sweep"
            else:
                enabled, why = stop_state(self.model, row, situation)
        if not enabled:
            return self._say(f"{label} cannot act now: {why}", error=True)
        try:
            text = act(self.model, self.stopper, trial_id)
        except Exception as exc:  # noqa: BLE001 - shown in the widget
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            return self._say(f"{label} failed: {first}", error=True)
        self.refresh()
        return self._say(text)

    def _say(self, text: str, error: bool = False) -> str:
        colour = "#c62828" if error else "#333"
        stamp = time.strftime("%H:%M:%S")
        with self._lock:
            self.status.value = f'<span style="color:{colour}">{stamp} {html.escape(text)}</span>'
        return text
