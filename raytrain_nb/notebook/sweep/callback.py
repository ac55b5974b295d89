"""The sweep dashboard as a Ray Tune callback: ``tune.RunConfig(callbacks=[dash], stop=dash.stopper)``.

Tune calls the callback on the thread that runs ``tuner.fit()``: each hook writes the plain-data
:class:`~.model.SweepModel`, and the front end chosen as for the group dashboard (:mod:`..ui`: widgets
in a Jupyter kernel, a text table elsewhere) follows it. While it shows, Tune's own progress tables
are off: in a notebook Tune 2.60 uses its legacy output, whose every table and per-result line is
gated by ``ray.tune.utils.log``'s verbosity, which :meth:`SweepDashboard.setup` sets to 0 (Tune sets
it again at the start of every run). In a terminal, Tune's newer output is a callback of its own that
no other callback can reach: ``tune.RunConfig(verbose=0)`` keeps it to its start banner.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import Any, Dict, List, Optional, TextIO

from ..._internal.extras import require
from .. import ui
from ..routing import CellRoute, current_parent
from .actions import act
from .fitting import fit_in_thread
from .model import NOT_RUNNING_WHY, NOT_WIRED_WHY, StopSituation, SweepModel
from .stopper import DashboardStopper
from .text import SweepText, table

tune = require("ray.tune")
tune_log = require("ray.tune.utils.log", "tune")
tune_output = require("ray.tune.experimental.output", "tune")

logger = logging.getLogger(__name__)

TERMINAL_NOTE = ("(Tune prints its own progress as well: tune.RunConfig(verbose=0) leaves this table "
                 "and Tune's start banner)")


def _cell_id() -> str:
    """The request id of the cell running now ("" outside a kernel)."""
    return ((current_parent() or {}).get("header") or {}).get("msg_id", "")


def _headless(metric: Optional[str], mode: Optional[str], scope: str) -> "SweepDashboard":
    """What an unpickled dashboard is (Tune pickles its RunConfig with the Tuner): one that shows nothing."""
    return SweepDashboard(metric, mode, scope=scope, ui="none")


class SweepDashboard(tune.Callback):
    """A Ray Tune sweep as a live table and plot, with a Stop button per trial.

    In a notebook::

        dash = SweepDashboard(metric="loss", mode="min")
        tuner = tune.Tuner(train_fn, param_space={"lr": tune.loguniform(1e-4, 1e-1)},
                           tune_config=tune.TuneConfig(num_samples=8, metric="loss", mode="min"),
                           run_config=tune.RunConfig(callbacks=[dash], stop=dash.stopper))
        results = await dash.fit(tuner)   # the Stop buttons act while the sweep runs

    ``results = tuner.fit()`` shows and updates the same dashboard, but holds the cell: the kernel
    handles a click only once it has ended, so the Stop buttons are off then (their tooltip says so).

    Args:
        metric: the metric shown and ranked (None: ``loss`` if reported, else the first number).
        mode: ``"min"`` or ``"max"``, needed with ``metric``.
        scope: ``"last"`` (a trial's latest value ranks it, as ``get_best_result()``) or ``"all"`` (its best).
        ui: ``"widgets"``, ``"text"`` or ``"none"``; None chooses as the group dashboard does
            (``RAYTRAIN_NB_UI``, else widgets in a Jupyter kernel and text elsewhere).
        stream: where the text table goes (default ``sys.stdout``).
        plot_interval_s: the plot is drawn at most this often.

    Attributes:
        model: the :class:`~.model.SweepModel` (plain data).
        stopper: the Tune ``Stopper`` to pass as ``tune.RunConfig(stop=...)``.
        view: the :class:`~.view.SweepView` (widgets) once shown, else None.
        text: the :class:`~.text.SweepText` (text fallback) once shown, else None.

    Raises:
        ValueError: an unknown ``mode``, ``scope`` or ``ui``, or ``metric`` without ``mode``.
    """

    def __init__(self, metric: Optional[str] = None, mode: Optional[str] = None, *, scope: str = "last",
                 ui: Optional[str] = None, stream: Optional[TextIO] = None, plot_interval_s: float = 1.0) -> None:
        if ui is not None and ui not in ("widgets", "text", "none"):
            raise ValueError(f"ui={ui!r} is unknown: use 'widgets', 'text', 'none' or None (choose by front end)")
        self.model = SweepModel(metric, mode, scope)
        self.stopper = DashboardStopper()
        self.ui = ui
        self.stream = stream
        self.plot_interval_s = plot_interval_s
        self.view: Any = None
        self.text: Optional[SweepText] = None
        self._mode: Optional[str] = None
        self._displayed_in: Optional[str] = None  # the cell (request id) the widget was shown in
        self._ui_thread = threading.current_thread()
        self._clicks_now = True
        self._wired: Optional[bool] = None

    # -- showing ---------------------------------------------------------------------------------

    def _front(self) -> str:
        """Build the front end once (widgets, text or none) and return its mode."""
        if self._mode is None:
            mode = self.ui or ui.ui_mode()
            if mode == "widgets":
                from .view import SweepView  # ipywidgets: only when the widget is shown

                self.view = SweepView(self.model, self.stopper, self.situation, plot_interval_s=self.plot_interval_s)
            elif mode == "text":
                new_engine = os.environ.get("RAY_AIR_NEW_OUTPUT", "1") != "0" and not tune_output.IS_NOTEBOOK
                self.text = SweepText(self.model, self.stream, note=TERMINAL_NOTE if new_engine else "")
            self._mode = mode
        return self._mode

    def show(self) -> Any:
        """Show the dashboard in the current cell (once), or set up the text table; returns the view, the
        text reporter, or None (``ui="none"``)."""
        mode = self._front()
        if mode == "widgets" and self._displayed_in is None:
            self._display()
        return self.view if mode == "widgets" else self.text

    def _display(self) -> None:
        from IPython.display import display  # IPython: only when the widget is shown

        self._displayed_in = _cell_id()
        display(self.view.widget)

    def _show_for_run(self) -> Any:
        """At a sweep's start: show the dashboard, again if Tune's notebook reporter just cleared this cell.

        Tune's notebook table clears the cell's output when it is made (at verbosity 1, Tune's default),
        just before the callbacks' ``setup``: a dashboard shown earlier in the same cell is gone then.
        """
        mode = self._front()
        if mode == "widgets" and self._displayed_in is not None:
            cleared = tune_output.IS_NOTEBOOK and not tune_log.has_verbosity(tune_log.Verbosity.V2_TRIAL_NORM)
            if cleared and _cell_id() == self._displayed_in:
                self._display()
        return self.show()

    def _repr_mimebundle_(self, **kwargs: Any) -> Dict[str, Any]:
        if self._front() == "widgets":
            self._displayed_in = _cell_id()
            return self.view.widget._repr_mimebundle_(**kwargs)
        return {"text/plain": "\n".join(table(self.model))}

    def __reduce__(self) -> Any:
        return (_headless, (self.model.given_metric, self.model.mode if self.model.given_metric else None,
                            self.model.scope))

    def situation(self) -> StopSituation:
        """Whether the Stop buttons can act now (read by the view)."""
        return StopSituation(running=self.model.running, clicks_now=self._clicks_now, wired=self._wired)

    # -- what users call -------------------------------------------------------------------------

    async def fit(self, tuner: Any) -> Any:
        """``results = await dash.fit(tuner)``: ``tuner.fit()`` on a thread while the cell awaits it, so the
        Stop buttons act at once (the dashboard shows in this cell when the sweep starts). Ctrl-C stops every
        trial and returns the results so far, as Tune does.

        Returns:
            What ``tuner.fit()`` returns (a ``ResultGrid``).
        """
        return await fit_in_thread(tuner, self.stopper.request_all, enter=CellRoute().enter)

    def stop(self, trial_id: Optional[str] = None) -> str:
        """Stop ``trial_id`` at its next report, or with None the whole sweep (the buttons' twin).

        Raises:
            RuntimeError: no sweep is running, or Tune does not ask :attr:`stopper`.
            ValueError: no such trial.
        """
        if not self.model.running:
            raise RuntimeError(NOT_RUNNING_WHY)
        if self._wired is False:
            raise RuntimeError(NOT_WIRED_WHY)
        text = act(self.model, self.stopper, trial_id)
        self._changed()
        return text

    # -- Tune's hooks (on the thread that runs tuner.fit()) ----------------------------------------

    def setup(self, **info: Any) -> None:
        self.stopper.reset()
        self.model.begin()
        self._wired = None  # Tune hands callbacks only its dict criteria: the first result tells
        self._clicks_now = not (ui.in_kernel() and threading.current_thread() is self._ui_thread)
        front = self._show_for_run()
        if front is None:
            return
        tune_log.set_verbosity(0)  # Tune's legacy tables (a notebook's): this dashboard replaces them
        front.start()

    def _changed(self) -> None:
        if self.view is not None:
            self.view.poke()

    def on_trial_start(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
        self.model.start(trial.trial_id, str(trial), trial.evaluated_params)
        self._changed()

    def on_trial_result(self, iteration: int, trials: List[Any], trial: Any, result: Dict[str, Any],
                        **info: Any) -> None:
        tid = trial.trial_id
        if not self._wired:  # Tune asked the stopper about this result before telling the callbacks
            self._wired = self.stopper.was_asked(tid)
        stopped_by = ""
        if result.get("done"):  # Tune decided at this result to end the trial
            ours = self.stopper.stopped(tid)
            stopped_by = ("sweep" if self.model.stop_all_requested else "button") if ours else "tune"
        self.model.add_result(tid, result, stopped_by)

    def on_trial_complete(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
        self.model.complete(trial.trial_id)
        self._changed()

    def on_trial_error(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
        where = trial.error_file
        self.model.fail(trial.trial_id, f"the trial raised: see {where}" if where else "the trial raised")
        self._changed()

    def on_trial_recover(self, iteration: int, trials: List[Any], trial: Any, **info: Any) -> None:
        self.model.recover(trial.trial_id)
        self._changed()

    def _sync(self, trials: List[Any]) -> bool:
        changed = False
        for trial in trials:
            new = trial.trial_id not in self.model.rows
            changed |= self.model.see(trial.trial_id, trial.status, str(trial) if new else "",
                                      trial.evaluated_params if new else None)
        return changed

    def on_step_end(self, iteration: int, trials: List[Any], **info: Any) -> None:
        if self._sync(trials):
            self._changed()
        if self.text is not None:
            self.text.update()

    def on_experiment_end(self, trials: List[Any], **info: Any) -> None:
        self._sync(trials)
        self.model.end()
        if self.view is not None:
            self.view.finish()
        if self.text is not None:
            self.text.finish()
