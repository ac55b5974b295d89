"""A load test of the driver's path at 256 ranks: simulated ranks in this process, no Ray.

Every 100 ms (the driver's poll round) each of 256 ranks answers a poll with one line of output and one report,
as a rank reporting 10 times a second does. The answers go through ``Dispatch.take_polls``, the driver's whole
path: output through the notebook sink and its rate cap, metrics into the core (history, ``metrics.jsonl`` for
rank 0, the slow-rank check, the observers), the dashboard's model and its timer thread. The test measures the CPU
this thread spends per simulated second and the widget messages, and checks the driver keeps up with room to spare.
"""
from __future__ import annotations

import contextlib
import io
import time

import ipywidgets

from raytrain_nb import GroupState
from raytrain_nb._internal.checkpoint.run_storage import RunStorage
from raytrain_nb._internal.group.config import GroupConfig
from raytrain_nb._internal.group.core import GroupCore, Settings, history_cap
from raytrain_nb._internal.group.dispatch import Dispatch
from raytrain_nb._internal.group.slots import Slot
from raytrain_nb.notebook.dashboard.view import MAX_MESSAGES_PER_S, Dashboard
from raytrain_nb.notebook.sink import NotebookSink

from .fake_group import FakeGroup

N, ROUNDS, ROUND_S = 256, 30, 0.1
#: CPU seconds the driver may spend per second of 256 ranks' polls (measured ~0.1-0.2 here: a core keeps up 5x).
MAX_CPU_PER_S = 0.4


class CoreGroup(FakeGroup):
    """The dashboard's view of a group whose observers are the real core's."""

    def __init__(self, core: GroupCore) -> None:
        super().__init__(N)
        self.core = core

    def subscribe(self, cb):
        self.core.subscribe(cb)

    def subscribe_metrics(self, cb):
        self.core.subscribe_metrics(cb)


def _polls(round_no: int, t: float):
    return {rank: {"outputs": [("stdout", f"rank {rank} step {round_no} loss 0.{rank:03d}\n")],
                   "metrics": [{"rank": rank, "time": t, "metrics": {"step": round_no, "loss": 1.0 / (rank + 1)}}],
                   "running": "cell", "collective": None,
                   "resources": {"cpu": 99.0, "rss": 1 << 30} if round_no % 10 == 0 else None, "debug": None}
            for rank in range(N)}


def test_the_drivers_path_keeps_up_with_256_ranks_reporting_10_times_a_second(tmp_path):
    core = GroupCore(GroupConfig(num_workers=N), Settings("load", 1.0, 1.0, 1.0, 0),
                     run_storage=RunStorage(str(tmp_path), "load"))
    core.slots.assign([Slot(actor=f"a{i}", pg="pg", bundle=i, info={"pid": 10 + i, "node_id": f"n{i // 8}"},
                            joined=True) for i in range(N)])
    group = CoreGroup(core)
    dash = Dashboard(group, plot_interval_s=1.0)
    sent = []
    original = ipywidgets.Widget._send
    ipywidgets.Widget._send = lambda w, msg, buffers=None: (sent.append(msg), original(w, msg, buffers=buffers))
    sink = NotebookSink()
    dispatch = Dispatch(core, lambda ranks: None, {}, sink, "all", list(range(N)))
    try:
        group.set_state(GroupState.RUNNING, **{f"r{r}": "running" for r in range(N)})
        cpu = 0.0
        started = time.monotonic()
        with contextlib.redirect_stdout(io.StringIO()) as out:
            for round_no in range(ROUNDS):
                polls = _polls(round_no, time.time())
                before = time.thread_time()
                dispatch.take_polls(polls)
                cpu += time.thread_time() - before
                time.sleep(max(0.0, started + (round_no + 1) * ROUND_S - time.monotonic()))
        seconds = ROUNDS * ROUND_S
        per_s = cpu / seconds
        print(f"driver path at {N} ranks x 10 reports/s: {per_s * 1e3:.0f} ms CPU per second, "
              f"{len(sent) / seconds:.0f} widget messages/s, {len(out.getvalue()) / seconds / 1e3:.0f} kB/s output")
        assert per_s < MAX_CPU_PER_S, f"{per_s:.2f} s of CPU per second of polls"
        assert len(sent) <= MAX_MESSAGES_PER_S * (seconds + 2), f"{len(sent)} widget messages in {seconds:g} s"
        assert all(len(core.metrics_history[r]) == ROUNDS for r in (0, N - 1))
        assert core.metrics_history[0].maxlen == history_cap(N) == 1953, "256 ranks keep 500,000 records in all"
        assert dash.model.rows[N - 1].reports == ROUNDS or dash.model.rows[N - 1].step == ROUNDS - 1
        assert f"rank {N - 1} step {ROUNDS - 1}" in out.getvalue(), "under the rate cap every line is shown"
    finally:
        ipywidgets.Widget._send = original
        dash.close()
