"""Trainer pieces without Ray: recovery decisions, report collection, progress text, callbacks, Result."""
from __future__ import annotations

import io
import json
import sys
import types

import pytest

from raytrain_nb import Result, ScalingConfig
from raytrain_nb._internal.errors import RankFailure, ResourceError, WorkerDiedError, WorkerError
from raytrain_nb._internal.group import placement, policy
from raytrain_nb._internal.group.slots import Slot, SlotTable
from raytrain_nb._internal.group.state import SlotState
from raytrain_nb._internal.train import elastic
from raytrain_nb._internal.train.callbacks import (CallbackRunner, CSVLoggerCallback, JsonLoggerCallback,
                                                   TensorBoardCallback, TrainRunContext, UserCallback)
from raytrain_nb._internal.train.progress import ProgressLine, ReportCollector, TrainSink, summarize


class FakeGroup:
    """Just what elastic.decide/growth read, as WorkerGroup's public members give it: the workers with a state
    and a placement (pg, bundle), the free places, each rank's status."""

    def __init__(self, states, free=()):
        table = SlotTable()
        table.assign([Slot(actor=f"actor{i}", pg=f"pg{i}", bundle=i, info={}, state=SlotState(s))
                      for i, s in enumerate(states)])
        self.slots = tuple(table)
        self.free_places = tuple(free)
        self.config = types.SimpleNamespace(placement_bundle=lambda: {"CPU": 1.0})

    @property
    def num_workers(self):
        return len(self.slots)

    def status(self):
        return [types.SimpleNamespace(rank=i, state=s.state) for i, s in enumerate(self.slots)]


def _died(rank):
    return RankFailure.of_lost(WorkerDiedError(rank, "SIGKILL", pid=100 + rank, node="127.0.0.1"))


@pytest.fixture
def no_wait(monkeypatch):
    monkeypatch.setattr(elastic, "ELASTIC_WAIT_S", 0.0)
    monkeypatch.setattr(elastic, "RESOURCE_WAIT_S", 0.0)
    retired = []
    monkeypatch.setattr(policy, "retire", lambda slots: retired.append([s.bundle for s in slots]))
    return retired


def test_decisions(no_wait, monkeypatch):
    fixed, flexible = ScalingConfig(num_workers=2), ScalingConfig(num_workers=(1, 3))
    raised = WorkerError([RankFailure(1, "ValueError", "boom"), RankFailure(0, "RuntimeError", "Connection reset by peer",
                                                                           collateral=True)])
    assert isinstance(elastic.decide(FakeGroup(["failed", "idle"]), raised, fixed), policy.Retry)
    died = WorkerError([_died(1)])
    monkeypatch.setattr(placement, "bundles_placed", lambda places: [True] * len(places))  # a killed process: its place is there
    decision = elastic.decide(FakeGroup(["idle", "dead"]), died, flexible)
    assert decision == policy.Restart([1], decision.reason) and "resources are free" in decision.reason
    assert no_wait == [[1]]  # the dead worker is retired before its place is looked at
    monkeypatch.setattr(placement, "bundles_placed", lambda places: [False] * len(places))  # a lost node
    decision = elastic.decide(FakeGroup(["idle", "dead", "idle"]), died, flexible)
    assert decision.num_workers == 2 and isinstance(decision, policy.Resize)
    assert "continuing with 2 worker(s)" in decision.reason
    with pytest.raises(ResourceError, match=r"rank\(s\) 1 died .* did not come back .*elastic ScalingConfig"):
        elastic.decide(FakeGroup(["idle", "dead"]), died, fixed)
    with pytest.raises(ResourceError, match=r"at least 2 needed"):
        elastic.decide(FakeGroup(["idle", "dead"]), died, ScalingConfig(num_workers=(2, 3)))
    assert isinstance(elastic.decide(FakeGroup(["dead"]), WorkerError([_died(0)]), fixed), policy.Recreate)


def test_retire_lets_ray_record_deaths_before_killing(monkeypatch):
    # until Ray records a worker on a lost node as dead, the node's bundles still look placed; our own
    # kill would be recorded at once and hide that: so wait for the dead ones first, then kill them all
    from raytrain_nb._internal.group import retiring

    calls = []
    monkeypatch.setattr(retiring, "await_recorded_deaths", lambda actors: calls.append(("await", list(actors))))
    monkeypatch.setattr(retiring, "kill_worker", lambda slot: calls.append(("kill", slot.actor)))
    slots = [types.SimpleNamespace(state=s, actor=f"a{i}") for i, s in enumerate(["dead", "unresponsive", "idle"])]
    retiring.retire(slots)
    assert calls == [("await", ["a0"]), ("kill", "a0"), ("kill", "a1"), ("kill", "a2")]


def test_growth_fills_lost_places_first(monkeypatch):
    ray = types.ModuleType("ray")
    ray.available_resources = lambda: {"CPU": 5.0}
    monkeypatch.setitem(sys.modules, "ray", ray)
    placed = {("pgA", 1): False, ("pgA", 2): True}
    monkeypatch.setattr(elastic, "bundles_placed", lambda places: [placed[p] for p in places])
    flexible = ScalingConfig(num_workers=(1, 4))
    group = FakeGroup(["idle"], free=[("pgA", 1), ("pgA", 2)])
    # one lost place is back, one is not: free resources go to the missing place first, so only count the one
    assert elastic.growth(group, flexible) == 1
    placed[("pgA", 1)] = True
    assert elastic.growth(group, flexible) == 3  # both places back, and room for one more (max 4)
    assert elastic.growth(group, ScalingConfig(num_workers=1)) == 0
    assert elastic.start_size(flexible, {"CPU": 2.0}) == 2 and elastic.start_size(flexible, {"CPU": 9.0}) == 1


def test_reports_complete_when_every_rank_reported():
    seen = []
    c = ReportCollector(2)
    c.listeners.append(lambda name, metrics, records: seen.append((name, metrics)))
    c.on_records([{"rank": 0, "report": "checkpoint_000001", "metrics": {"loss": 1.0}}])
    assert seen == []
    c.on_records([{"rank": 1, "report": "checkpoint_000001", "metrics": {"loss": 3.0}},
                  {"rank": 1, "report": "checkpoint_000002", "metrics": {"loss": 2.0}}])
    assert seen == [("checkpoint_000001", [{"loss": 1.0}, {"loss": 3.0}])]
    c.reset(1)
    c.on_records([{"rank": 0, "report": "checkpoint_000003", "metrics": {"loss": 0.5}}])
    assert seen[-1] == ("checkpoint_000003", [{"loss": 0.5}]) and c.completed == 2


def test_progress_text_one_line_per_report(monkeypatch):
    assert summarize([{"step": 3, "loss": 1.0, "lr": 0.1}, {"step": 3, "loss": 3.0, "lr": 0.1}]) == \
        "step=3 loss=1 (mean 2) lr=0.1"
    err = io.StringIO()
    monkeypatch.setattr(sys, "stderr", err)
    line = ProgressLine(enabled=True, desc="run1")
    assert line._bar is None  # not a terminal: plain lines
    for step in range(3):
        line.on_report("r", [{"step": step * 10, "loss": 0.5}, {"step": step * 10, "loss": 0.5}], [{}, {}])
    line.close()
    lines = err.getvalue().splitlines()
    assert lines[0] == "(run1) report 1: step=0 loss=0.5 [2 workers]"
    assert lines[-1].startswith("(run1) report 3: step=20 loss=0.5 [2 workers, ") and "steps/s]" in lines[-1]
    out = io.StringIO()
    monkeypatch.setattr(sys, "stdout", out)
    sink = TrainSink(line)
    sink.stream(1, "stdout", "hello\nwor", False)
    sink.stream(1, "stdout", "ld\n", False)
    assert out.getvalue() == "[rank 1] hello\n[rank 1] world\n"
    quiet = ProgressLine(enabled=False)
    quiet.on_report("r", [{"loss": 1}], [{}])
    quiet.close()


def test_callback_runner_accepts_both_hook_forms_and_survives_errors(caplog):
    calls = []

    class Ours(UserCallback):
        def after_report(self, metrics, checkpoint):
            calls.append(("ours", metrics, checkpoint))

        def after_exception(self, errors):
            raise RuntimeError("callback bug")

    class RayStyle:
        def after_report(self, run_context, metrics, checkpoint):
            calls.append(("ray", run_context.name, metrics))

        def after_exception(self, run_context, worker_exceptions):
            calls.append(("ray-exc", sorted(worker_exceptions)))

    ctx = TrainRunContext("run1", "/tmp/run1", 2)
    runner = CallbackRunner([Ours(), RayStyle()], ctx)
    runner.setup()
    runner.after_report([{"a": 1}], None)
    runner.after_exception({1: ValueError("x")})
    runner.teardown()
    assert calls == [("ours", [{"a": 1}], None), ("ray", "run1", [{"a": 1}]), ("ray-exc", [1])]
    assert "callback Ours.after_exception failed" in caplog.text


def test_loggers_and_result_from_path(tmp_path):
    from raytrain_nb._internal.checkpoint.manager import CheckpointManager
    from raytrain_nb._internal.checkpoint.metrics_log import append_metrics

    run = tmp_path / "run1"
    ctx = TrainRunContext("run1", str(run), 1)
    loggers = [JsonLoggerCallback(), CSVLoggerCallback()]
    runner = CallbackRunner(loggers, ctx)
    runner.setup()
    src = tmp_path / "src"
    src.mkdir()
    (src / "w.txt").write_text("weights")
    mgr = CheckpointManager(str(run), score_attribute="loss", score_order="min")
    for step, loss in enumerate([0.5, 0.2, 0.4]):
        append_metrics(str(run), {"step": step, "loss": loss, "_time": 100.0 + step})
        entry = mgr.persist(str(src), "reported", {"step": step, "loss": loss})
        runner.after_report([{"step": step, "loss": loss}], entry.checkpoint)
    append_metrics(str(run), {"step": 3, "loss": 0.3, "_time": 104.0})  # a report without a checkpoint
    result = Result.from_path(str(run))
    assert result.metrics == {"step": 3, "loss": 0.3} and result.error is None
    assert result.checkpoint.path.endswith("checkpoint_000003")
    assert [m["loss"] for _, m in result.best_checkpoints] == [0.2, 0.4, 0.5]
    assert result.get_best_checkpoint("loss", "max").path.endswith("checkpoint_000001")
    with pytest.raises(ValueError, match="mode='best' is unknown"):
        result.get_best_checkpoint("loss", "best")
    df = result.metrics_dataframe
    assert list(df["step"]) == [0, 1, 2, 3] and list(df["timestamp"]) == [100.0, 101.0, 102.0, 104.0]
    rows = [json.loads(l) for l in (run / "result.json").read_text().splitlines()]
    assert rows[1] == {"step": 1, "loss": 0.2, "checkpoint_dir_name": "checkpoint_000002"}
    assert (run / "progress.csv").read_text().splitlines() == ["step,loss", "0,0.5", "1,0.2", "2,0.4"]
    from raytrain_nb._internal.errors import CheckpointError

    with pytest.raises(CheckpointError, match="is not a run directory"):
        Result.from_path(str(tmp_path / "nothing"))


def test_tensorboard_callback_writes_or_skips(tmp_path, caplog):
    from raytrain_nb._internal.train.callbacks import tensorboard_writer_class

    cb = TensorBoardCallback()
    cb.setup(TrainRunContext("run1", str(tmp_path), 1))
    cb.after_report([{"step": 1, "loss": 0.5, "name": "x"}], None)
    cb.teardown()
    if tensorboard_writer_class() is None:
        assert "TensorBoardCallback skipped" in caplog.text
    else:
        assert any(p.name.startswith("events.out.tfevents") for p in (tmp_path / "tensorboard").iterdir())


def test_fit_shows_the_dashboard_only_where_widgets_render(monkeypatch):
    # the core reaches the notebook's dashboard only through the hook raytrain_nb registers
    from raytrain_nb._internal import frontend
    from raytrain_nb.notebook import ui

    shown = []
    monkeypatch.setattr(ui, "show", lambda group, mode=None: shown.append((group, mode)) or object())
    monkeypatch.setattr(ui, "ui_mode", lambda: "text")
    assert frontend.show_fit_dashboard("g") is False and shown == []  # a terminal: the text progress line
    monkeypatch.setattr(ui, "ui_mode", lambda: "widgets")
    assert frontend.show_fit_dashboard("g") is True and shown == [("g", "widgets")]
    monkeypatch.setattr(ui, "show", lambda group, mode=None: 1 / 0)
    assert frontend.show_fit_dashboard("g") is False  # a broken dashboard never stops training


def test_without_a_front_end_the_core_says_what_is_missing(monkeypatch):
    from raytrain_nb._internal import frontend
    from raytrain_nb._internal.errors import GroupError

    monkeypatch.setattr(frontend, "_FRONTEND", None)
    assert frontend.show_fit_dashboard("g") is False  # fit() shows text progress
    with pytest.raises(GroupError, match=r"no dashboard front end is registered.*%dist_status"):
        frontend.dashboard("g")


def test_cells_and_fit_share_one_failure_policy(no_wait):
    """--on-failure's policy is the trainer's, set for cells: no retry of a cell that raised, no new group."""
    died = WorkerError([_died(1)])
    raised = WorkerError([RankFailure(1, "ValueError", "boom")])
    restart, rescale = policy.FailurePolicy("restart"), policy.FailurePolicy("rescale")
    assert restart.decide(FakeGroup(["idle", "dead"]), died) == policy.Restart([1], "rank(s) 1 died: replacing them")
    assert no_wait == []  # the restart itself waits for the place (up to the group's placement timeout)
    assert rescale.decide(FakeGroup(["idle", "dead", "idle"]), died) == \
        policy.Resize(2, "rank(s) 1 died: continuing with 2 worker(s)")
    assert restart.decide(FakeGroup(["failed", "idle"]), raised) is None
    assert rescale.decide(FakeGroup(["dead", "dead"]), died) is None
