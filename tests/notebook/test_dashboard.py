"""The dashboard on a real group (real Ray workers), driven with Button.click(): no browser.

Each button must change the group the way its magic does, and the widget must show it: rows,
badges, progress bars, the checkpoint list, the status line, and which buttons are on.
"""
from __future__ import annotations

import os
import signal

import pytest

from raytrain_nb._internal.output import CollectSink
from raytrain_nb.notebook.dashboard.view import dashboard_for

from ..groups import assert_ranks_identical, rank_params, same_state, set_up_group
from ..waiting import wait_for

pytestmark = pytest.mark.ray

SETUP = """
import time, torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
torch.manual_seed(0)
model = prepare_model(torch.nn.Linear(6, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
"""
TRAIN = """
for step in range({n}):
    x = torch.randn(8, 6)
    loss = (model(x) - x.sum(1, keepdim=True)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    train.report({{"step": step, "loss": loss.item()}}{total})
    time.sleep({pause})
"""


def params(g):
    return [p.detach().clone() for p in g.pull("model").parameters()]


@pytest.fixture(scope="module")
def group(ray_session):
    with set_up_group(SETUP) as g:
        yield g


@pytest.fixture(scope="module")
def dash(group):
    d = dashboard_for(group, plot_interval_s=0.3)
    yield d
    d.close()


def test_one_row_per_rank_with_worker_facts_and_idle_buttons(group, dash):
    assert dashboard_for(group) is dash and group.dashboard() is dash
    statuses = group.status()
    assert sorted(dash.rows) == [0, 1]
    for st in statuses:
        row = dash.rows[st.rank]
        assert row.pid.value == str(st.pid) and row.node.value == st.node and row.device.value == "cpu"
        assert ">idle<" in row.state.value and "rtnb-state-idle" in row.box._dom_classes
    b = dash.buttons
    assert not b["checkpoint"].disabled and not b["shutdown"].disabled
    assert (b["restart"].disabled, b["restart"].tooltip) == (True, "no dead worker: every rank is alive")
    assert (b["rollback"].disabled, b["rollback"].tooltip) == (True, "no checkpoint yet: take one with Checkpoint")
    assert (b["interrupt"].disabled, b["interrupt"].tooltip) == (True, "nothing is running")
    assert "2 workers" in dash.title.value and ">idle<" in dash.title.value


def test_reports_move_the_bars_and_fill_the_plot(group, dash):
    renders = dash.renders
    group.run(TRAIN.format(n=20, total=", total=20", pause=0.01), sink=CollectSink())
    dash.flush()  # the timer thread does this within 100 ms
    for rank in (0, 1):
        row = dash.rows[rank]
        assert (row.bar.value, row.bar.max, row.done.value) == (20, 20, "20/20")
        assert row.rate.value.endswith("steps/s") and "loss=" in row.metrics.value
    wait_for(lambda: dash.renders > renders and dash._plotted[0] == dash.model.version, 30, "the plot")
    assert bytes(dash.image.value).startswith(b"\x89PNG") and dash.metric.value == "loss"
    assert list(dash.metric.options) == ["loss", "step time (s)"]  # the seconds between reports, per rank


def test_resources_the_slow_rank_and_the_where_button(group, dash):
    group.run("rank = train.get_context().get_world_rank()\nfor step in range(7):\n"
              "    time.sleep(0.12 if rank == 1 else 0.02)\n"
              "    train.report({'step': step})\n", sink=CollectSink())
    row = dash.rows[1]
    wait_for(lambda: "SLOW" in row.resources.value and "rss " in dash.rows[0].resources.value, 10,
             "rank 1 marked slow and rank 0's resources in their rows")
    assert "rtnb-slow" in row.resources.value and "SLOW" not in dash.rows[0].resources.value
    assert dash.where.press() == "ranks 0, 1: idle (no cell running)" and "idle" in dash.where.output.value
    assert "foreground cell" in dash.where.button.tooltip


def test_steps_flag_sets_the_total_when_reports_do_not(group, dash):
    dash.model.expect_steps(40)
    group.run(TRAIN.format(n=10, total="", pause=0), sink=CollectSink())
    dash.flush()
    assert (dash.rows[0].bar.value, dash.rows[0].bar.max, dash.rows[0].done.value) == (10, 40, "10/40")


def test_plot_controls_rerender_and_log_scale_keeps_positive_points(dash):
    renders = dash.renders
    dash.log.value = True
    dash.mode.value = "mean"
    wait_for(lambda: dash.renders > renders and dash._plotted[2:] == ("mean", True), 30, "a log-scale mean plot")
    plot = dash._plot
    assert plot.axes.get_yscale() == "log" and list(plot._lines) == ["mean"]
    ys = plot._lines["mean"].get_ydata()
    assert len(ys) > 0 and min(ys) > 0
    assert "(log scale)" in plot.axes.get_title()
    dash.log.value, dash.mode.value = False, "per rank"


def test_checkpoint_button_lists_it_and_rollback_restores_parameters(group, dash):
    dash.buttons["checkpoint"].click()
    assert "saved snapshot_" in dash.status.value, dash.status.value
    name = group.checkpoints()[-1].name
    assert dash.checkpoint_list.value == name and name in dash.checkpoint_list.options[0][0]
    assert "step 9" in dash.checkpoint_list.options[0][0]
    saved = params(group)
    group.run(TRAIN.format(n=5, total="", pause=0), sink=CollectSink())
    assert not same_state(saved, params(group))
    dash.flush()
    assert not dash.buttons["rollback"].disabled
    dash.buttons["rollback"].click()
    assert f"rolled back to {name}" in dash.status.value, dash.status.value
    assert same_state(saved, params(group))


def test_background_cell_checkpoint_mid_cell_then_interrupt(group, dash):
    bg = group.run(TRAIN.format(n=100000, total="", pause=0.01), sink=CollectSink(), background=True)
    wait_for(lambda: ">running<" in dash.rows[1].state.value and dash.rows[1].bar.value > 0, 60, "running rows")
    dash.flush()  # the title and the buttons, to be sure the timer's flush that moved the rows finished
    assert "background cell running" in dash.title.value
    b = dash.buttons
    assert not b["checkpoint"].disabled and not b["interrupt"].disabled
    for name in ("rollback", "restart", "rescale", "shutdown"):
        assert b[name].disabled and "a background cell is running" in b[name].tooltip, name
    before = len(group.checkpoints())
    b["checkpoint"].click()  # taken at the next report() of every rank
    assert "saved snapshot_" in dash.status.value and len(group.checkpoints()) == before + 1
    assert len(dash.checkpoint_list.options) == before + 1
    b["interrupt"].click()
    assert "interrupted every rank" in dash.status.value
    with pytest.raises(Exception, match="KeyboardInterrupt"):
        bg.wait(60)
    wait_for(lambda: group.state.value == "idle" and not b["shutdown"].disabled, 30, "the group idle again")
    dash.flush()  # re-forming the process group after the interrupt marks the ranks again, with no notice
    for st in group.status(ping=False):  # each row shows the core's account of its rank
        assert f">{st.state}<" in dash.rows[st.rank].state.value, (st, dash.rows[st.rank].state.value)


def test_an_error_is_shown_in_the_status_line(group, dash):
    dash.rescale_to.value = 64
    dash.buttons["rescale"].click()
    assert "Rescale to failed:" in dash.status.value and "64" in dash.status.value, dash.status.value
    assert group.num_workers == 2
    dash.rescale_to.value = 2


def test_killed_worker_turns_red_and_restart_turns_it_green(group, dash):
    victim = group.status()[1]
    os.kill(victim.pid, signal.SIGKILL)
    row = dash.rows[1]
    wait_for(lambda: "rtnb-state-dead" in row.box._dom_classes, 60, "rank 1's row to turn red")
    dash.flush()
    assert "died" in row.metrics.value or "killed" in row.metrics.value, row.metrics.value
    assert row.bar.bar_style == "danger" and row.box.layout.border_left.startswith("4px solid #c62828")
    b = dash.buttons
    assert not b["restart"].disabled and "replace rank(s) 1" in b["restart"].tooltip
    assert b["checkpoint"].disabled and "rank(s) 1 are dead" in b["checkpoint"].tooltip
    b["restart"].click()
    assert "restarted rank(s) 1" in dash.status.value, dash.status.value
    row = dash.rows[1]
    assert "rtnb-state-idle" in row.box._dom_classes and "rtnb-state-dead" not in row.box._dom_classes
    assert row.pid.value != str(victim.pid) and row.bar.bar_style != "danger"
    assert b["restart"].disabled and not b["checkpoint"].disabled
    group.run("x = 1", sink=CollectSink())  # the replaced worker runs cells


def test_rescale_button_shrinks_and_grows_the_rows_and_the_group(group, dash):
    dash.flush()  # the previous test's last cell ended: its end reaches the buttons at the next tick, or now
    b = dash.buttons
    assert b["rescale"].disabled and "already has 2 workers" in b["rescale"].tooltip
    dash.rescale_to.value = 1
    assert not b["rescale"].disabled and "to 1 worker," in b["rescale"].tooltip
    b["rescale"].click()
    assert "the group has 1 worker" in dash.status.value, dash.status.value
    assert group.num_workers == 1 and sorted(dash.rows) == [0] and len(dash.rows_box.children) == 2
    assert " 1 worker · " in dash.title.value
    dash.rescale_to.value = 2
    b["rescale"].click()
    assert "the group has 2 workers" in dash.status.value, dash.status.value
    assert sorted(dash.rows) == [0, 1] and "rtnb-state-idle" in dash.rows[1].box._dom_classes
    assert group.run("train.get_context().get_world_size()", sink=CollectSink()).value == "2"
    assert_ranks_identical(rank_params(group), "parameters")


def test_shutdown_button_stops_the_group_and_the_dashboard(group, dash):
    dash.buttons["shutdown"].click()
    assert group.state.value == "shut down" and dash.closed
    assert all(btn.disabled and "shut down" in btn.tooltip for btn in dash.buttons.values())
