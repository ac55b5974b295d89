"""The dashboard's model without widgets: progress, rates, series, button rules."""
from __future__ import annotations

from raytrain_nb import WorkerStatus
from raytrain_nb.notebook.dashboard.model import DashboardModel, Situation, button_states, format_metrics


def _status(rank: int, state: str = "idle", pid: int = 0, error: str = "") -> WorkerStatus:
    return WorkerStatus(rank=rank, node="n", pid=pid or 100 + rank, device="cpu", state=state, last_metrics={},
                        error=error)


def _rec(rank, t, **metrics):
    total = metrics.pop("total", None)
    rec = {"rank": rank, "time": t, "metrics": metrics}
    if total is not None:
        rec["total"] = total
    return rec


def test_progress_counts_a_reported_step_as_done_against_its_total():
    m = DashboardModel()
    m.set_workers([_status(0)])
    m.begin_cell()
    m.add_records([_rec(0, 0.0, step=0, loss=1.0, total=10)])
    assert m.rows[0].progress() == (1, 10, "1/10")
    m.add_records([_rec(0, 1.0, step=9, loss=0.5)])
    assert m.rows[0].progress() == (10, 10, "10/10")
    m.add_records([_rec(0, 2.0, step=20)])  # past the total: the bar stays full
    assert m.rows[0].progress()[0] == 10


def test_steps_flag_gives_the_total_and_resets_per_cell():
    m = DashboardModel()
    m.set_workers([_status(0)])
    m.expect_steps(50)
    m.begin_cell()
    m.add_records([_rec(0, 0.0, step=4)])
    assert m.rows[0].progress() == (5, 50, "5/50")
    m.begin_cell()  # the next cell has no --steps: no total
    assert m.rows[0].progress() == (0, 1, "")
    m.add_records([_rec(0, 0.0, step=3)])
    assert m.rows[0].progress() == (1, 1, "step 4")


def test_without_a_step_metric_each_report_is_a_step():
    m = DashboardModel()
    m.set_workers([_status(0)])
    m.begin_cell()
    for i in range(3):
        m.add_records([_rec(0, float(i), loss=1.0)])
    assert m.rows[0].progress() == (1, 1, "3 reports")


def test_rate_is_steps_per_second_over_recent_reports():
    m = DashboardModel()
    m.set_workers([_status(0)])
    m.begin_cell()
    for i in range(11):
        m.add_records([_rec(0, i * 0.1, step=i * 2)])
    assert abs(m.rows[0].rate - 20.0) < 1e-6
    assert m.rows[0].rate_text() == "20 steps/s"


def test_a_cell_whose_reports_all_arrive_in_one_batch_still_has_a_rate():
    m = DashboardModel()
    m.set_workers([_status(0), _status(1)])
    m.begin_cell()
    m.add_records([_rec(r, i * 0.01, step=i, loss=1.0) for i in range(20) for r in (0, 1)])
    for r in (0, 1):
        assert abs(m.rows[r].rate - 100.0) < 1e-6 and m.rows[r].progress() == (1, 1, "step 20")
    m.begin_cell()
    m.add_records([_rec(0, 5.0, loss=1.0), _rec(0, 5.5, loss=0.5)])  # no step metric: each report is a step
    assert m.rows[0].progress() == (1, 1, "2 reports") and abs(m.rows[0].rate - 2.0) < 1e-6


def test_series_keep_x_increasing_across_cells_and_are_capped():
    m = DashboardModel(max_points=100, plot_points=50)
    for cell in range(2):
        m.begin_cell()
        for i in range(80):
            m.add_records([_rec(0, float(i), step=i, loss=1.0 / (i + 1))])
    pts = m.series[0].points
    assert len(pts) <= 100
    xs = [x for x, _ in pts]
    assert xs == sorted(xs) and xs[-1] == 159  # the second cell continues after the first
    (line,) = m.lines("loss")
    assert len(line.xs) <= 51 and line.xs[-1] == 159 and line.label == "rank 0"


def test_mean_line_averages_ranks_at_each_step():
    m = DashboardModel()
    m.add_records([_rec(0, 0.0, step=0, loss=1.0), _rec(1, 0.0, step=0, loss=3.0)])
    (line,) = m.lines("loss", mean=True)
    assert (line.label, line.xs, line.ys) == ("mean", [0.0], [2.0])
    assert [l.label for l in m.lines("loss")] == ["rank 0", "rank 1"]
    assert m.default_metric() == "loss" and m.lines(None) == []


def test_a_replaced_worker_gets_a_fresh_row_and_dropped_ranks_go():
    m = DashboardModel()
    m.set_workers([_status(0), _status(1, "dead", error="killed")])
    m.add_records([_rec(1, 0.0, step=3)])
    assert m.rows[1].state == "dead" and m.rows[1].error == "killed"
    m.set_workers([_status(0), _status(1, "idle", pid=999)])
    assert m.rows[1].state == "idle" and m.rows[1].error == "" and m.rows[1].reports == 0
    m.set_workers([_status(0)])
    assert list(m.rows) == [0]


def test_format_metrics_leaves_out_the_step_and_cuts_long_text():
    assert format_metrics({"step": 3, "loss": 0.123456, "acc": 1}) == "loss=0.1235 acc=1"
    assert len(format_metrics({f"m{i}": 1.0 for i in range(50)}, limit=20)) == 20


def test_buttons_idle_group_without_checkpoints():
    s = button_states(Situation(group_state="idle", num_workers=2, rescale_to=2))
    assert s["checkpoint"][0] and s["shutdown"][0]
    assert s["rollback"] == (False, "no checkpoint yet: take one with Checkpoint")
    assert s["restart"] == (False, "no dead worker: every rank is alive")
    assert s["rescale"] == (False, "the group already has 2 workers")
    assert s["interrupt"] == (False, "nothing is running")


def test_buttons_with_a_dead_worker_point_at_recovery():
    s = button_states(Situation(group_state="failed", gone=[1], num_workers=2, rescale_to=2, checkpoints=1,
                                selected=("snapshot_1", "snapshot")))
    assert s["restart"][0] and "replace rank(s) 1" in s["restart"][1]
    assert s["rescale"][0]  # dropping the dead rank is a rescale to the same size
    assert not s["checkpoint"][0] and "rank(s) 1 are dead" in s["checkpoint"][1]
    assert not s["rollback"][0] and "Restart dead workers" in s["rollback"][1]


def test_buttons_during_a_background_cell():
    s = button_states(Situation(group_state="running", background=True, num_workers=2, rescale_to=3,
                                checkpoints=1, selected=("snapshot_1", "snapshot")))
    assert s["checkpoint"] == (True, "snapshot the warm state at the next report() of every rank")
    assert s["interrupt"][0]
    for name in ("rollback", "restart", "rescale", "shutdown"):
        assert not s[name][0] and "a background cell is running" in s[name][1], name


def test_buttons_during_a_foreground_cell_or_after_shutdown_are_all_off():
    fg = button_states(Situation(group_state="running", foreground=True))
    assert all(not on and "foreground" in why for on, why in fg.values())
    down = button_states(Situation(group_state="shut down"))
    assert all(not on and "shut down" in why for on, why in down.values())


def test_rollback_needs_a_selected_snapshot():
    base = dict(group_state="idle", num_workers=2, rescale_to=2, checkpoints=2)
    assert button_states(Situation(**base))["rollback"] == (False, "select a checkpoint in the list")
    why = button_states(Situation(**base, selected=("checkpoint_000001", "reported")))["rollback"]
    assert not why[0] and "reported checkpoint" in why[1]
    assert button_states(Situation(**base, selected=("s", "snapshot")))["rollback"][0]
    assert button_states(Situation(**dict(base, rescale_to=0)))["rescale"] == \
        (False, "give a number of workers of at least 1")
