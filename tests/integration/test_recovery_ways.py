"""A new rank ends up with its peers' named objects however the notebook built them.

Replaying setup cells is not enough: a model may be built in a cell that also trains it, by a function
called from a later cell, rebuilt later under the same name, held in a dict or an attribute, or there may
be several models and optimizers at once. A replacement (restart) and a new rank (rescale) get what they
lack from a live peer. Every step is bounded: a hang fails the test, it never hangs it.
"""
from __future__ import annotations

import os
import signal
import threading

import pytest

from raytrain_nb import RecoveryError, WorkerError, WorkerGroup
from raytrain_nb._internal.output import CollectSink

from ..groups import FIRST_CELL, MarkerSink, assert_ranks_identical
from ..waiting import bounded

TRAIN_FOREVER = "print('training', flush=True)\nwhile True:\n    steps(1)"

#: How the state of every rank is read: each tracked object's tensors, by path.
STATE = """
def _state(objs):
    out = {}
    for name, obj in objs.items():
        sd = obj.state_dict() if hasattr(obj, 'state_dict') else obj
        flat = {}
        def walk(prefix, v):
            if isinstance(v, torch.Tensor):
                flat[prefix] = v.detach().cpu().clone()
            elif isinstance(v, dict):
                for k, x in v.items():
                    walk(f"{prefix}/{k}", x)
            elif isinstance(v, (list, tuple)):
                for i, x in enumerate(v):
                    walk(f"{prefix}/{i}", x)
            elif isinstance(v, (int, float)):
                flat[prefix] = v
        walk(name, sd)
        out[name] = flat
    return out
"""


def run(group, source, timeout=120, **options):
    return bounded(timeout, f"the cell {source.strip().splitlines()[0]!r}",
                   lambda: group.run(source, sink=CollectSink(), **options))


def states(group, objects):
    """Every rank's tensors of ``objects`` (an expression of a dict name -> object), pulled."""
    run(group, STATE + f"_st = _state({objects})")
    return bounded(60, "pulling the state", lambda: group.pull("_st", rank=None))


def kill_rank_mid_cell(group, rank, source):
    """Run ``source`` (which prints 'training', then loops) and SIGKILL ``rank``'s process once it trains."""
    sink = MarkerSink()
    pid = group.status()[rank].pid

    def fire():
        if sink.seen.wait(60):
            os.kill(pid, signal.SIGKILL)

    threading.Thread(target=fire, daemon=True).start()
    with pytest.raises(WorkerError):
        bounded(90, "the cell during which a rank is killed", lambda: group.run(source, sink=sink, output="all"))


def test_issue_scenario_first_cell_trains_then_kill_restart_rescale_1_2(ray_session):
    """The named regression: a DDP model built in a cell that also trained it, a rank killed, %dist_restart,
    %dist_rescale 1, %dist_rescale 2, a training cell after each; every step bounded."""
    group = bounded(180, "starting the group", lambda: WorkerGroup(2, heartbeat_timeout_s=5))
    try:
        run(group, FIRST_CELL)
        kill_rank_mid_cell(group, 1, TRAIN_FOREVER)
        assert bounded(120, "%dist_restart", group.restart) == [1]
        run(group, "steps(3)")
        assert_ranks_identical(states(group, "{'model': model, 'opt': opt}"))
        bounded(120, "%dist_rescale 1", lambda: group.rescale(1))
        run(group, "steps(3)")
        bounded(120, "%dist_rescale 2", lambda: group.rescale(2))
        run(group, "steps(3)")
        per_rank = states(group, "{'model': model, 'opt': opt}")
        assert_ranks_identical(per_rank)
        assert per_rank[0]["opt"], "the optimizer's momentum was not kept"
        # The new rank's optimizer steps the model it holds (not a copy), and DDP keeps ranks equal.
        assert run(group, "any(p is q for p in model.parameters() for q in opt.param_groups[0]['params'])",
                   ranks=[1]).value == "True"
        assert group.num_workers == 2 and [r.state for r in group.status()] == ["idle", "idle"]
    finally:
        group.shutdown()


#: Each way a notebook holds its objects: (setup cell, a cell that builds or rebuilds and trains, a training cell,
#: the tracked objects by name). Their names differ, so one group holds all of them at once, each built as its
#: way has it, and one restart and one rescale check every way.
WAYS = {
    "built-in-a-function-called-later": (
        "import torch\nfrom raytrain_nb.torch import prepare_model\n"
        "def build():\n    global fmodel, fopt\n    fmodel = prepare_model(torch.nn.Linear(8, 2))\n"
        "    fopt = torch.optim.Adam(fmodel.parameters(), lr=0.01)\n",
        "torch.manual_seed(1)\nbuild()\nloss = fmodel(torch.randn(4, 8)).sum(); fopt.zero_grad(); loss.backward(); "
        "fopt.step()",
        "loss = fmodel(torch.randn(4, 8)).sum(); fopt.zero_grad(); loss.backward(); fopt.step()",
        "{'model': fmodel, 'opt': fopt}"),
    "rebuilt-later-under-the-same-name": (
        "import torch\nfrom raytrain_nb.torch import prepare_model\ntorch.manual_seed(0)\n"
        "model = prepare_model(torch.nn.Linear(8, 2))\nopt = torch.optim.SGD(model.parameters(), lr=0.1)\n",
        "model = prepare_model(torch.nn.Sequential(torch.nn.Linear(8, 6), torch.nn.Linear(6, 3)))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)\n"
        "loss = model(torch.randn(4, 8)).sum(); opt.zero_grad(); loss.backward(); opt.step()",
        "loss = model(torch.randn(4, 8)).sum(); opt.zero_grad(); loss.backward(); opt.step()",
        "{'model': model, 'opt': opt}"),
    "held-in-a-dict": (
        "import torch\nfrom raytrain_nb.torch import prepare_model\n",
        "torch.manual_seed(2)\nnets = {'a': prepare_model(torch.nn.Linear(8, 2))}\n"
        "opts = {'a': torch.optim.SGD(nets['a'].parameters(), lr=0.1, momentum=0.5)}\n"
        "loss = nets['a'](torch.randn(4, 8)).sum(); opts['a'].zero_grad(); loss.backward(); opts['a'].step()",
        "loss = nets['a'](torch.randn(4, 8)).sum(); opts['a'].zero_grad(); loss.backward(); opts['a'].step()",
        "{'net': nets['a'], 'opt': opts['a']}"),
    "attribute-of-an-object": (
        "import torch\nfrom raytrain_nb.torch import prepare_model\nclass Box:\n    pass\n",
        "torch.manual_seed(3)\nbox = Box()\nbox.model = prepare_model(torch.nn.Linear(8, 2))\n"
        "box.opt = torch.optim.SGD(box.model.parameters(), lr=0.1, momentum=0.5)\n"
        "box.sched = torch.optim.lr_scheduler.StepLR(box.opt, step_size=1, gamma=0.5)\n"
        "loss = box.model(torch.randn(4, 8)).sum(); box.opt.zero_grad(); loss.backward(); box.opt.step(); "
        "box.sched.step()",
        "loss = box.model(torch.randn(4, 8)).sum(); box.opt.zero_grad(); loss.backward(); box.opt.step(); "
        "box.sched.step()",
        "{'model': box.model, 'opt': box.opt, 'sched': box.sched, 'is_box': isinstance(box, Box)}"),
    "gan-style-two-models-two-optimizers": (
        "import torch\nfrom raytrain_nb.torch import prepare_model\n",
        "torch.manual_seed(4)\nG = prepare_model(torch.nn.Linear(4, 8))\nD = prepare_model(torch.nn.Linear(8, 1))\n"
        "opt_g = torch.optim.Adam(G.parameters(), lr=1e-3)\nopt_d = torch.optim.Adam(D.parameters(), lr=1e-3)\n"
        "scaler = torch.amp.GradScaler('cpu', enabled=False)\n"
        "def gan_step():\n    d = D(G(torch.randn(4, 4)).detach()).mean(); opt_d.zero_grad(); d.backward(); opt_d.step()\n"
        "    g = -D(G(torch.randn(4, 4))).mean(); opt_g.zero_grad(); g.backward(); opt_g.step()\n"
        "gan_step()",
        "gan_step()",
        "{'G': G, 'D': D, 'opt_g': opt_g, 'opt_d': opt_d, 'scaler': scaler}"),
}
#: Every way's objects in one dict, each name prefixed with its way, so a difference names the way.
ALL_OBJECTS = "{" + ", ".join(f"**{{f'{way}: {{k}}': v for k, v in ({objects}).items()}}"
                              for way, (_, _, _, objects) in sorted(WAYS.items())) + "}"


def test_a_replacement_and_a_new_rank_get_the_same_named_objects_however_they_were_built(ray_session):
    """Every way at once in one group: each one's setup and training cells as a notebook runs them, then a rank
    killed and restarted, a training cell, a rescale to 3 and another; every rank equals rank 0 after each."""
    group = bounded(180, "starting the group", lambda: WorkerGroup(2, heartbeat_timeout_s=5))
    try:
        for way in sorted(WAYS):
            setup, train_cell, _, _ = WAYS[way]
            run(group, setup)
            run(group, train_cell)
        again = "\n".join(WAYS[way][2] for way in sorted(WAYS))
        os.kill(group.status()[1].pid, signal.SIGKILL)
        bounded(120, "%dist_restart", group.restart)
        assert_ranks_identical(states(group, ALL_OBJECTS))
        run(group, again)
        assert_ranks_identical(states(group, ALL_OBJECTS))
        bounded(120, "%dist_rescale 3", lambda: group.rescale(3))
        run(group, again)
        per_rank = states(group, ALL_OBJECTS)
        assert_ranks_identical(per_rank)
        assert {name.split(": ")[0] for name in per_rank[0]} == set(WAYS), sorted(per_rank[0])
    finally:
        group.shutdown()


def test_an_object_a_new_rank_cannot_get_fails_fast_naming_it_and_the_survivors_stay(ray_session):
    group = bounded(180, "starting the group", lambda: WorkerGroup(2, heartbeat_timeout_s=5))
    try:
        run(group, FIRST_CELL)
        run(group, "import threading\nlock = threading.Lock()\nsteps(2)")  # a lock cannot be pickled
        before = states(group, "{'model': model, 'opt': opt}")
        # Rescale up: the new rank cannot get `lock`; the group stays as it was, usable.
        with pytest.raises(RecoveryError, match=r"lock \(TypeError: cannot pickle '_thread.lock'.*--setup"):
            bounded(60, "%dist_rescale 3", lambda: group.rescale(3))
        assert group.num_workers == 2 and group.state == "idle"
        assert_ranks_identical([before[0], *states(group, "{'model': model, 'opt': opt}")])
        # Restart: the same, fast; the survivor keeps its state and the group can go on without the lost rank.
        os.kill(group.status()[1].pid, signal.SIGKILL)
        with pytest.raises(RecoveryError, match="lock"):
            bounded(60, "%dist_restart", group.restart)
        assert [r.state for r in group.status()] == ["idle", "dead"]
        bounded(60, "%dist_rescale 1", lambda: group.rescale(1))
        assert_ranks_identical([before[0], *states(group, "{'model': model, 'opt': opt}")])
        run(group, "steps(1)")
        # The way out the message names: a cell marked --setup is replayed, so new ranks make their own lock.
        run(group, "lock = threading.Lock()", setup=True)
        bounded(120, "%dist_rescale 2", lambda: group.rescale(2))
        assert run(group, "type(lock).__name__", ranks=[1]).value == "'lock'"
    finally:
        group.shutdown()
