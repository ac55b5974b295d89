"""The dashboard: per-rank progress, a live metrics plot, the checkpoint list and recovery buttons.

Stock ipywidgets and matplotlib only. The dashboard subscribes to the group's observers
(state changes and reported metrics); rows and progress bars update as records arrive (trait
updates, safe from any thread), the plot is rendered to PNG on a timer thread at most every
``plot_interval_s`` and only when something changed. Each button calls one public
:class:`~raytrain_nb.WorkerGroup` method, the one its magic calls, and shows the result or the
error in the dashboard's status line.

Clicks while the kernel is busy: see :mod:`.clicks`. During a foreground ``%%distributed`` cell
the buttons are disabled (their tooltip says why); during a ``--background`` cell they work.
"""
from __future__ import annotations

import html
import logging
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional

import ipywidgets as w

from ..routing import current_parent
from ..view_helpers import state_badge
from .actions import ICONS, LABELS, STYLES, act, entry_label
from .clicks import click_guard
from .model import BUTTONS, GONE, STATE_COLOURS, DashboardModel, Situation, button_states, n_workers
from .rows import RowWidgets, header_row

logger = logging.getLogger(__name__)

_DASHBOARDS: "weakref.WeakKeyDictionary[Any, Dashboard]" = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()


def dashboard_for(group: Any, **options: Any) -> "Dashboard":
    """The dashboard of ``group`` (made on first use, then the same one)."""
    with _LOCK:
        dash = _DASHBOARDS.get(group)
        if dash is None or dash.closed:
            dash = _DASHBOARDS[group] = Dashboard(group, **options)
        return dash


def existing_dashboard(group: Any) -> Optional["Dashboard"]:
    return _DASHBOARDS.get(group)


class Dashboard:
    """The live view of one :class:`~raytrain_nb.WorkerGroup`; display it as a cell's value.

    Args:
        group: the group to show and control.
        plot_interval_s: the plot is re-rendered at most this often (and only when it changed).
        max_points: points kept per rank (older ones are thinned beyond that).

    Attributes:
        buttons: ``{"checkpoint"|"rollback"|"restart"|"rescale"|"interrupt"|"shutdown": Button}``.
        rows: one :class:`RowWidgets` per rank.
        status: the HTML line that shows each button's result or error.
        checkpoint_list: the ``Select`` of the run's checkpoints.
    """

    def __init__(self, group: Any, *, plot_interval_s: float = 1.0, max_points: int = 4000) -> None:
        self.group = group
        self.model = DashboardModel(max_points=max_points)
        self.plot_interval_s = plot_interval_s
        self.closed = False
        self.guard = click_guard()
        self._ui_thread = threading.current_thread()  # the thread that handles clicks (the kernel's)
        self._lock = threading.RLock()
        self._foreground = False
        self._action: Optional[str] = None
        self._entries: List[Any] = []
        self._wake = threading.Event()
        self._stopped = threading.Event()
        self._states: Dict[str, Any] = {}
        self._want_checkpoints = True
        self._plotted = (-1, None, None, None)
        self._plot: Any = None
        self.renders = 0
        self._build()
        group.subscribe(self._on_state)
        group.subscribe_metrics(self._on_metrics)
        self._sync_workers()
        self.refresh_checkpoints()
        self._hook_cells()
        self._thread = threading.Thread(target=self._loop, name="rtnb-dashboard", daemon=True)
        self._thread.start()

    # -- building ------------------------------------------------------------------------------

    def _build(self) -> None:
        self.title = w.HTML()
        self.rows: Dict[int, RowWidgets] = {}
        self.rows_box = w.VBox([header_row()])
        self.rows_box.add_class("rtnb-rows")
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
        b = self.buttons
        actions = w.HBox([b["checkpoint"], b["restart"], b["rescale"], self.rescale_to, b["interrupt"],
                          b["shutdown"]], layout=w.Layout(flex_flow="row wrap"))
        ckpts = w.HBox([self.checkpoint_list, b["rollback"]], layout=w.Layout(align_items="flex-start"))
        self.widget = w.VBox([
            self.title, self.rows_box, w.HBox([self.image, controls]),
            w.HTML("<b>Checkpoints</b>"), ckpts, actions, self.status,
        ], layout=w.Layout(border="1px solid #ddd", padding="6px", width="100%"))
        self.widget.add_class("rtnb-dashboard")

    def _repr_mimebundle_(self, **kwargs: Any) -> Any:
        return self.widget._repr_mimebundle_(**kwargs)

    def __repr__(self) -> str:
        return f"Dashboard({self.group!r})"

    def _hook_cells(self) -> None:
        """After every cell, re-read the checkpoint list (``%dist_checkpoint`` may have added one)."""
        try:
            from IPython import get_ipython  # IPython: only inside a kernel
        except ImportError:  # pragma: no cover
            return
        shell = get_ipython()
        if shell is not None:
            self._post_cell = lambda *_: self._poke(checkpoints=True)
            shell.events.register("post_run_cell", self._post_cell)

    # -- observers (any thread) ----------------------------------------------------------------

    def _on_state(self, old: Any, new: Any) -> None:
        if self.closed:
            return
        value = new.value
        if value == "running" and old.value != "running":
            self.model.begin_cell()
        with self._lock:
            if threading.current_thread() is self._ui_thread:
                self._foreground = value in ("running", "recovering")
            elif value not in ("running", "recovering"):
                self._foreground = False
        self._sync_workers()
        if value == "shut down":
            self._say("the group was shut down: a new %%distributed cell starts another")
            self.close()
        elif value in ("idle", "failed"):
            self._poke(checkpoints=True)

    def _on_metrics(self, records: Any) -> None:
        if self.closed:
            return
        changed = self.model.add_records(records)
        with self._lock:
            for rank in changed:
                row = self.rows.get(rank)
                if row is not None:
                    row.update(self.model.rows[rank], full=False)
        self._poke(checkpoints=any(r.get("checkpoint") for r in records))

    def _sync_workers(self) -> None:
        """Rows from the group's own account of its workers (no pinging)."""
        self.model.set_workers(self.group.status(ping=False))
        with self._lock:
            ranks = sorted(self.model.rows)
            if ranks != sorted(self.rows):
                for rank in set(self.rows) - set(ranks):
                    del self.rows[rank]
                for rank in ranks:
                    self.rows.setdefault(rank, RowWidgets(rank))
                self.rows_box.children = [header_row()] + [self.rows[r].box for r in ranks]
            for rank in ranks:
                self.rows[rank].update(self.model.rows[rank])
            self._update_title()
            self._update_buttons()

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
                btn = self.buttons[name]
                with btn.hold_sync():
                    btn.disabled = not enabled
                    btn.tooltip = why
            self._states = states

    def _update_title(self) -> None:
        g = self.group
        where = ""
        if g.state.value in ("running", "recovering"):
            where = " · foreground cell running" if self._foreground else " · background cell running"
        self.title.value = (f"<b>raytrain_nb</b> · {html.escape(g.name)} · {n_workers(g.num_workers)} · "
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
        enabled, why = self._states.get(name, (False, "the dashboard is starting"))
        if not enabled:
            self._say(f"{label} cannot act now: {why}", error=True)
            return
        with self.guard.busy():
            self._action = name
            self._update_buttons()
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
        if self.closed:
            self._update_buttons()
        else:
            self.refresh_checkpoints()
            self._sync_workers()

    def _act(self, name: str) -> str:
        return act(self.group, name, checkpoint=self.checkpoint_list.value, workers=int(self.rescale_to.value))

    # -- checkpoints and the plot (timer thread) -----------------------------------------------------

    def refresh_checkpoints(self) -> None:
        """Re-read the run's checkpoints into the list, keeping the selection (else the newest)."""
        try:
            entries = self.group.checkpoints()
        except Exception as exc:  # noqa: BLE001 - e.g. storage gone; say so in the widget
            self._say(f"cannot list the checkpoints: {exc}", error=True)
            return
        with self._lock:
            self._entries = list(entries)
            options = [(entry_label(e), e.name) for e in reversed(self._entries)]
            current = self.checkpoint_list.value
            names = [n for _, n in options]
            known = {n for _, n in self.checkpoint_list.options}
            if list(self.checkpoint_list.options) != options:
                if any(n not in known for n in names) or current not in names:
                    current = names[0] if names else None  # a new checkpoint: select it (newest first)
                with self.checkpoint_list.hold_sync():
                    self.checkpoint_list.options = options
                    self.checkpoint_list.value = current
            self._update_buttons()

    def _poke(self, checkpoints: bool = False) -> None:
        if checkpoints:
            self._want_checkpoints = True
        self._wake.set()

    def _loop(self) -> None:
        """Re-list checkpoints when asked; re-render the plot when it changed, at most every interval."""
        last = 0.0
        while not self.closed:
            self._wake.wait(self.plot_interval_s)
            self._wake.clear()
            rest = last + self.plot_interval_s - time.monotonic()
            if rest > 0 and self._stopped.wait(rest):
                break
            if self.closed:
                break
            try:
                if self._want_checkpoints:
                    self._want_checkpoints = False
                    self.refresh_checkpoints()
                with self._lock:  # text cells held back by the throttle catch up
                    for rank, row in list(self.rows.items()):
                        if rank in self.model.rows:
                            row.update(self.model.rows[rank], full=False)
                if self._render_if_changed():
                    last = time.monotonic()
            except Exception:  # noqa: BLE001 - the timer must go on
                logger.exception("dashboard update failed")

    def _render_if_changed(self) -> bool:
        keys = list(self.model.metric_keys)
        if list(self.metric.options) != keys:
            with self.metric.hold_sync():
                current = self.metric.value
                self.metric.options = keys
                self.metric.value = current if current in keys else self.model.default_metric()
        key = (self.model.version, self.metric.value, self.mode.value, self.log.value)
        if key == self._plotted and self.renders:
            return False
        if self._plot is None:
            from .plot import MetricsPlot  # matplotlib: only once the plot is first drawn

            self._plot = MetricsPlot()
        lines = self.model.lines(self.metric.value, mean=self.mode.value == "mean")
        self.image.value = self._plot.render(lines, self.metric.value, log=self.log.value)
        self._plotted = key
        self.renders += 1
        return True

    def close(self) -> None:
        """Stop updating (the group was shut down, or the dashboard is no longer wanted)."""
        self.closed = True
        self._stopped.set()
        self._wake.set()
        self._update_buttons()
        shell_hook = getattr(self, "_post_cell", None)
        if shell_hook is not None:
            from IPython import get_ipython  # IPython: only inside a kernel

            shell = get_ipython()
            if shell is not None:
                try:
                    shell.events.unregister("post_run_cell", shell_hook)
                except ValueError:
                    pass

