"""The dashboard: per-rank progress, a live metrics plot, the checkpoint list and recovery buttons.

Stock ipywidgets and matplotlib only. The group's observers run on the cell's path: they only update
the plain-data model and record what changed (:mod:`.sync`); a timer thread brings the widgets in line
at most every 100 ms, sending only traits whose value changed (a no-op ``%%distributed`` cell sends no
widget message), and renders the plot to PNG at most every ``plot_interval_s`` when it changed. Each
button calls the public :class:`~raytrain_nb.WorkerGroup` method its magic calls and shows the result
or the error in the status line. Clicks while the kernel is busy: see :mod:`.clicks`; during a
foreground ``%%distributed`` cell the buttons are disabled (the tooltip says why) once it ran 100 ms.
"""
from __future__ import annotations

import copy
import html
import logging
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence

import ipywidgets as w

from ..ratecap import MessageBudget
from ..routing import current_parent
from ..view_helpers import state_badge
from .actions import ICONS, LABELS, STYLES, act, checkpoint_rows, show_entries
from .cellhook import after_every_cell
from .clicks import click_guard
from .large import SummaryPanel
from .model import BUTTONS, GONE, STATE_COLOURS, DashboardModel, Situation, button_states, n_workers
from .rows import RowTable, RowWidgets
from .sync import FLUSH_INTERVAL_S, Pending, assign, count, sent
from .where import WherePanel

logger = logging.getLogger(__name__)

MAX_MESSAGES_PER_S = 50  #: widget messages a second at most, whatever the group's size and report rate
_DASHBOARDS: "weakref.WeakKeyDictionary[Any, Dashboard]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def dashboard_for(group: Any, **options: Any) -> "Dashboard":
    """The dashboard of ``group`` (made on first use, then the same one), showing the group as it is now."""
    with _LOCK:
        dash = _DASHBOARDS.get(group)
        if dash is None or dash.closed:
            dash = _DASHBOARDS[group] = Dashboard(group, **options)
            return dash
    dash.flush()  # asked for in a cell: what it shows (and code reads from it) is as of now
    return dash


def existing_dashboard(group: Any) -> Optional["Dashboard"]:
    return _DASHBOARDS.get(group)


class Dashboard:
    """The live view of one :class:`~raytrain_nb.WorkerGroup`; display it as a cell's value.

    Args:
        group: the group to show and control.
        plot_interval_s: the plot is re-rendered at most this often (and only when it changed).
        max_points: points kept per rank (older ones are thinned beyond that).
        flush_interval_s: the widgets are updated at most this often (:mod:`.sync`).
        clock: monotonic seconds (tests pass their own); timer: whether a thread updates the widgets
            (without it, :meth:`tick` does).
        max_messages_per_s: widget messages a second at most (the next update waits for what one sent).

    Attributes:
        buttons: ``{"checkpoint"|"rollback"|"restart"|"rescale"|"interrupt"|"shutdown": Button}``.
        rows: one :class:`RowWidgets` per rank.
        status: the HTML line that shows each button's result or error.
        checkpoint_list: the ``Select`` of the run's checkpoints.
    """

    def __init__(self, group: Any, *, plot_interval_s: float = 1.0, max_points: int = 4000,
                 flush_interval_s: float = FLUSH_INTERVAL_S, clock: Callable[[], float] = time.monotonic,
                 timer: bool = True, max_messages_per_s: float = MAX_MESSAGES_PER_S) -> None:
        self.group = group
        self.budget = MessageBudget(max_messages_per_s, clock=clock)
        self.model = DashboardModel(max_points=max_points)
        self.plot_interval_s = plot_interval_s
        self.closed = False
        self.guard = click_guard()
        self.flushes = 0  # widget updates made (each sends only what changed)
        self.renders = 0
        self._ui_thread = threading.current_thread()  # the thread that handles clicks (the kernel's)
        self._clock = clock
        self._pending = Pending(flush_interval_s, clock=clock)
        self._lock = threading.RLock()  # one flush at a time; never taken by the observers
        self._foreground = False
        self._action: Optional[str] = None
        self._entries: List[Any] = []
        self._stopped = threading.Event()
        self._states: Dict[str, Any] = {}
        self._plotted = (-1, None, None, None)
        self._rendered_at = float("-inf")
        self._plot: Any = None
        self._build()
        self.model.add_records(sorted((r for rs in getattr(group, "metrics_history", {}).values() for r in rs),
                                      key=lambda r: r.get("time", 0.0)))  # the reports so far (an attached group's)
        group.subscribe(self._on_state)
        group.subscribe_metrics(self._on_metrics)
        self.flush()
        self.budget = MessageBudget(max_messages_per_s, clock=clock)  # what is shown first is not an update
        # after every cell the checkpoint list is read again (%dist_checkpoint may have added one)
        self._unhook = after_every_cell(lambda *_: self._pending.mark(checkpoints=True))
        self._thread: Optional[threading.Thread] = None
        if timer:
            self._thread = threading.Thread(target=self._loop, name="rtnb-dashboard", daemon=True)
            self._thread.start()

    # -- building ------------------------------------------------------------------------------

    def _build(self) -> None:
        self.title = w.HTML()
        self.large = SummaryPanel(self.flush)  # beyond 16 ranks a summary and the rows it lists (.expand("8-15"))
        self.table = RowTable()
        self.rows: Dict[int, RowWidgets] = self.table.rows
        self.rows_box = self.table.box
        self.image = w.Image(format="png", layout=w.Layout(width="648px", height="234px"))
        self.image.add_class("rtnb-plot")
        self.metric = w.Dropdown(options=[], description="metric", layout=w.Layout(width="210px"))
        self.mode = w.ToggleButtons(options=["per rank", "mean"], value="per rank",
                                    style=w.ToggleButtonsStyle(button_width="76px"))
        self.log = w.Checkbox(value=False, description="log scale", indent=False)
        for ctl in (self.metric, self.mode, self.log):
            ctl.observe(lambda _change: self._poke(), names="value")
        controls = w.VBox([self.metric, self.mode, self.log], layout=w.Layout(padding="8px 0 0 8px"))
        self.checkpoint_list = w.Select(options=[], rows=5, layout=w.Layout(width="560px", margin="0 6px 0 0"))
        self.checkpoint_list.add_class("rtnb-checkpoints")
        self.checkpoint_list.observe(lambda _change: self._update_buttons(), names="value")
        self.rescale_to = w.BoundedIntText(value=max(self.group.num_workers, 1), min=1, max=1024,
                                           layout=w.Layout(width="64px"))
        self.rescale_to.observe(lambda _change: self._update_buttons(), names="value")
        self.buttons: Dict[str, w.Button] = {}
        for name in BUTTONS:
            btn = w.Button(description=LABELS[name], icon=ICONS[name], button_style=STYLES[name],
                           layout=w.Layout(width="auto", margin="2px 4px 2px 0"))
            btn.add_class(f"rtnb-btn-{name}")
            btn.on_click(self._handler(name))
            self.buttons[name] = btn
        self.status = w.HTML(value="")
        self.status.add_class("rtnb-status")
        b, self.where = self.buttons, WherePanel(self.group)  # where.py: the Where button and its answer
        actions = w.HBox([b["checkpoint"], b["restart"], b["rescale"], self.rescale_to, b["interrupt"],
                          b["shutdown"]], layout=w.Layout(flex_flow="row wrap"))
        ckpts = w.HBox([self.checkpoint_list, b["rollback"]], layout=w.Layout(align_items="flex-start"))
        self.widget = w.VBox([
            self.title, self.large.box, self.rows_box, w.HBox([self.image, controls]),
            w.HTML("<b>Checkpoints</b>"), ckpts, actions, self.status, self.where.box,
        ], layout=w.Layout(border="1px solid #ddd", padding="6px", width="100%"))
        self.widget.add_class("rtnb-dashboard")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"Dashboard({self.group!r})"

    # -- observers (any thread, on the cell's path: they record, the timer shows) ----------------

    def _on_state(self, old: Any, new: Any) -> None:
        if self.closed:
            return
        value, busy = new.value, ("running", "recovering")
        if value == "running" and old.value != "running":
            self.model.begin_cell()
        if threading.current_thread() is self._ui_thread:
            self._foreground = value in busy
        elif value not in busy:
            self._foreground = False
        cell = (value in busy) if (value in busy) != (old.value in busy) else None
        self._pending.mark(workers=True, checkpoints=value in ("idle", "failed"), cell=cell)
        if value == "shut down":
            self._say("the group was shut down: a new %%distributed cell starts another")
            self.close()

    def _on_metrics(self, records: Sequence[Dict[str, Any]]) -> None:
        if self.closed:
            return
        changed = self.model.add_records(records)
        self._pending.mark(ranks=changed, checkpoints=any(r.get("checkpoint") for r in records))

    # -- bringing the widgets in line (the timer thread; flush() on demand) ------------------------

    def flush(self) -> None:
        """Show the group as it is now: rows, title, checkpoints, buttons (only traits that differ are sent).

        The timer thread does this by itself within ~100 ms of a change; a click, :meth:`close` and
        tests call it to be sure.
        """
        self._flush(everything=True)

    def tick(self) -> bool:
        """The timer's step: flush when :class:`~.sync.Pending` says it is due, render the plot when due.

        Returns:
            Whether the widgets were flushed.
        """
        due = self._pending.due()  # then the last update's messages paid for (the budget) first:
        due = due if due is None else max(due, self.budget.ready_at())
        flushed = due is not None and due <= self._clock() and self._flush(everything=False)
        plot_due = self._plot_due()
        if plot_due is not None and max(plot_due, self.budget.ready_at()) <= self._clock():
            before = sent()
            self._render()
            self.budget.spend(sent() - before)
        return flushed

    def _flush(self, everything: bool, checkpoints: bool = True) -> bool:
        with self._lock:
            before = sent()
            try:
                return self._flush_now(everything, checkpoints)
            finally:
                self.budget.spend(sent() - before)

    def _flush_now(self, everything: bool, checkpoints: bool) -> bool:  # one flush, under self._lock
        seq, changes = self._pending.peek()
        entries = self._read_checkpoints() if checkpoints and (everything or changes.checkpoints) else None
        statuses = self.group.status(ping=False) if everything or changes.workers else None
        if not self._pending.clear(seq) and not everything and self._pending.holding():
            return False  # a cell started while this read: it shows once it ran 100 ms
        if entries is not None:
            self._show_checkpoints(entries)
        held = self._show_rows(statuses, changes.ranks)
        self._update_title()
        self._update_buttons()
        if held:  # text cells held back by their throttle catch up at a later flush
            self._pending.mark(ranks=held)
        self.flushes += 1
        return True

    def _show_rows(self, statuses: Optional[Sequence[Any]], ranks: Any) -> List[int]:
        """Rows from the group's own account of its workers (no pinging) and the model; ranks held back."""
        if statuses is not None:
            self.model.set_workers(statuses)
        with self.model.lock:
            views = {r: copy.copy(v) for r, v in self.model.rows.items()}
        views = self.large.pick(views)  # a large group: its summary, and rows only for the ranks it lists
        return self.table.show(views, None if statuses is not None else ranks, self._clock())

    # -- the header and buttons ----------------------------------------------------------------

    def _situation(self) -> Situation:
        selected = None
        name = self.checkpoint_list.value
        kinds = {e.name: e.kind for e in self._entries}
        if name in kinds:
            selected = (name, kinds[name])
        state = self.group.state.value
        return Situation(
            group_state=state, foreground=self._foreground or self._action is not None,
            background=state in ("running", "recovering") and not self._foreground,
            gone=[r for r, row in sorted(self.model.rows.items()) if row.state in GONE],
            num_workers=self.group.num_workers, rescale_to=self.rescale_to.value or 0,
            checkpoints=len(self._entries), selected=selected)

    def _update_buttons(self) -> None:
        with self._lock:
            states = button_states(self._situation())
            if self._action is not None:
                states = {b: (False, f"{LABELS[self._action]} is in progress") for b in BUTTONS}
            for name, (enabled, why) in states.items():
                assign(self.buttons[name], disabled=not enabled, tooltip=why)
            self._states = states

    def _update_title(self) -> None:
        g = self.group
        where = ""
        if g.state.value in ("running", "recovering"):
            where = " · foreground cell running" if self._foreground else " · background cell running"
        assign(self.title, value=f"<b>raytrain_nb</b> · {html.escape(g.name)} · {n_workers(g.num_workers)} · "
                                 f"{html.escape(str(g.backend))} · {state_badge(g.state.value, STATE_COLOURS)}{where}")

    def _say(self, text: str, error: bool = False) -> None:
        colour = "#c62828" if error else "#333"
        stamp = time.strftime("%H:%M:%S")
        self.status.value = (f'<span style="color:{colour}">{stamp} {html.escape(text)}</span>')

    # -- buttons ---------------------------------------------------------------------------------

    def _handler(self, name: str) -> Callable[[Any], None]:
        def on_click(_button: Any) -> None:
            try:
                self.press(name)
            except Exception:  # a handler never raises into the kernel log unseen
                logger.exception("dashboard button %s failed", name)
        return on_click

    def press(self, name: str) -> None:
        """What a click on button ``name`` does (also the test's and the script's entry point)."""
        label = LABELS[name]
        msg = current_parent()
        if self.guard.stale(msg):
            self._say(f"ignored a click on {label} made while the kernel was busy (it would have acted "
                      "after the cell): click again now", error=True)
            return
        self.guard.sample(msg)
        self.flush()  # the buttons as of now, not as of the last timer flush
        enabled, why = self._states.get(name, (False, "the dashboard is starting"))
        if not enabled:
            self._say(f"{label} cannot act now: {why}", error=True)
            return
        with self.guard.busy():
            self._action = name
            self.flush()
            self._say(f"{label}: working…")
            try:
                text = self._act(name)
            except (Exception, KeyboardInterrupt) as exc:
                first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
                logger.warning("dashboard: %s failed: %s", label, exc, exc_info=True)
                self._say(f"{label} failed: {first}", error=True)
            else:
                self._say(text)
            finally:
                self._action = None
        self.flush()

    def _act(self, name: str) -> str:
        return act(self.group, name, checkpoint=self.checkpoint_list.value, workers=int(self.rescale_to.value))

    # -- checkpoints and the plot ---------------------------------------------------------------

    def refresh_checkpoints(self) -> None:
        """Re-read the run's checkpoints into the list, keeping the selection (else the newest)."""
        with self._lock:
            entries = self._read_checkpoints()
            if entries is not None:
                self._show_checkpoints(entries)
                self._update_buttons()

    def _read_checkpoints(self) -> Optional[List[Any]]:
        try:
            return checkpoint_rows(self.group)  # with the reported ones still uploading
        except Exception as exc:  # noqa: BLE001 - e.g. storage gone; say so in the widget
            self._say(f"cannot list the checkpoints: {exc}", error=True)
            return None

    def _show_checkpoints(self, entries: List[Any]) -> None:
        if entries != self._entries:
            self._entries = entries
            show_entries(self.checkpoint_list, entries)

    def _poke(self) -> None:
        self._pending.wake.set()

    def _loop(self) -> None:
        """The timer thread: waits for a change (or the next flush or render due), then :meth:`tick`."""
        while not self._stopped.is_set():
            now = self._clock()
            due = [t - now for t in (self._pending.due(), self._plot_due()) if t is not None]
            # waits for a recorded change, or until the earliest flush or render is due (re-checks every 1 s)
            self._pending.wake.wait(max(0.0, min(due + [1.0])))
            self._pending.wake.clear()
            if self._stopped.is_set():
                break
            try:
                self.tick()
            except Exception:  # noqa: BLE001 - the timer must go on
                logger.exception("dashboard update failed")

    def _plot_due(self) -> Optional[float]:
        """When the plot is to be re-rendered (it changed, or was never drawn), or None."""
        if self.renders and self._plotted == (self.model.version, self.metric.value, self.mode.value, self.log.value):
            return None
        return self._rendered_at + self.plot_interval_s

    def _render(self) -> None:
        self._rendered_at = self._clock()  # first: a render that fails is not retried at once
        keys = list(self.model.metric_keys)
        if list(self.metric.options) != keys:
            count(1)
            with self.metric.hold_sync():
                current = self.metric.value
                self.metric.options = keys
                self.metric.value = current if current in keys else self.model.default_metric()
        key = (self.model.version, self.metric.value, self.mode.value, self.log.value)
        if self._plot is None:
            from .plot import MetricsPlot  # matplotlib: only once the plot is first drawn

            self._plot = MetricsPlot()
        lines = self.model.lines(self.metric.value, mean=self.mode.value == "mean")
        assign(self.image, value=self._plot.render(lines, self.metric.value, log=self.log.value))
        self._plotted = key
        self.renders += 1

    def close(self) -> None:
        """Stop updating (the group was shut down, or the dashboard is no longer wanted)."""
        self.closed = True
        self._stopped.set()
        self._pending.wake.set()
        self._flush(everything=True, checkpoints=False)  # the last look: rows, title, every button off
        unhook = getattr(self, "_unhook", None)
        if unhook is not None:
            unhook()
