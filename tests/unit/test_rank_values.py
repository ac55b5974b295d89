"""Rank values after a restart or rescale: which assignments are chosen (a static analysis, no Ray), how a rank
runs them again, and what the recovery's summary says."""
from __future__ import annotations

import types

import pytest

from raytrain_nb._internal.group.rank_refresh import RankValues, refresh_rank_values
from raytrain_nb._internal.worker.rank_values import CONTEXT_GETTERS, plan_rank_values, reevaluate
from raytrain_nb._internal.worker.session import TrainContext


def plan(*cells):
    return plan_rank_values([c.strip("\n") for c in cells])


def names(*cells):
    return list(plan(*cells).names)


def dependents(*cells):
    return list(plan(*cells).dependents)


# -- which names are rank values -----------------------------------------------------------------------------

def test_the_issue_cell_re_evaluates_rank_world_size_and_ctx_and_names_what_is_computed_from_them():
    p = plan("""
import torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
ctx = train.get_context()
rank = ctx.get_world_rank()
world_size = train.get_context().get_world_size()
is_main = rank == 0
lr = 0.1 * world_size
device = f"cuda:{rank}"
model = prepare_model(torch.nn.Linear(4, 1)); opt = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(3):
    loss = model(torch.randn(2, 4)).sum()
    train.report({"loss": loss.item()})
""")
    assert p.names == ("ctx", "rank", "world_size")
    assert p.statements == ("ctx = train.get_context()", "rank = ctx.get_world_rank()",
                            "world_size = train.get_context().get_world_size()")
    assert p.dependents == ("is_main", "lr", "device")


@pytest.mark.parametrize("cell, expected", [
    ("from raytrain_nb import get_context as gc\nr = gc().get_world_rank()", ["r"]),
    ("from raytrain_nb import get_context\nc = get_context()", ["c"]),
    ("import raytrain_nb\nr = raytrain_nb.get_context().get_local_rank()", ["r"]),
    ("import raytrain_nb.train as train\nr = train.get_context().get_node_rank()", ["r"]),
    ("from raytrain_nb import train\nr = train.get_context().get_local_world_size()", ["r"]),
    ("import raytrain_nb as rt\nd = rt.torch.get_device()", ["d"]),
    ("from raytrain_nb.torch import get_device\nd = get_device()", ["d"]),
    ("from raytrain_nb.train.torch import get_device as gd\nd = gd()", ["d"]),
    ("import torch.distributed as dist\nr = dist.get_rank()\nw = dist.get_world_size()", ["r", "w"]),
    ("from torch import distributed as dist\nr = dist.get_rank()", ["r"]),
    ("import torch\nr = torch.distributed.get_rank()", ["r"]),
    ("import torch.distributed\nr = torch.distributed.get_world_size()", ["r"]),
    ("import os\nr = os.environ['RANK']", ["r"]),
    ("import os\nr = int(os.environ['RANK'])", ["r"]),
    ("import os\nw = int(os.environ.get('WORLD_SIZE'))", ["w"]),
    ("import os\nw = os.environ.get('WORLD_SIZE', '1')", ["w"]),
    ("import os\nl = int(os.getenv('LOCAL_RANK'))", ["l"]),
    ("from os import environ\nr = environ['NODE_RANK']", ["r"]),
    ("from os import getenv as ge\nr = str(ge('LOCAL_WORLD_SIZE'))", ["r"]),
    ("import raytrain_nb as train\nrank: int = train.get_context().get_world_rank()", ["rank"]),
    ("import raytrain_nb as train\na = b = train.get_context()", ["a", "b"]),
    ("import raytrain_nb as train\nctx = train.get_context()\nrank, size = ctx.get_world_rank(), ctx.get_world_size()",
     ["ctx", "rank", "size"]),
    ("import raytrain_nb as train\nr = train.get_context().get_world_rank()\nr2 = r", ["r", "r2"]),
])
def test_each_way_of_reading_the_context_is_a_rank_value(cell, expected):
    assert names(cell) == expected


@pytest.mark.parametrize("cell", [
    "r = get_context().get_world_rank()",  # never imported: not ours
    "import os\nhome = os.environ['HOME']",  # not a rank variable
    "import os\nr = os.environ[key]",  # which variable is not known
    "import os\nr = os.getenv(name)",
    "import torch.distributed as dist\nr = dist.get_rank(group)",  # an argument that is not a constant
    "import raytrain_nb as train\nr = train.get_context().get_world_rank() + 0",
    "import raytrain_nb as train\nn = train.get_context().get_metadata()",  # not a rank getter
    "import raytrain_nb as train\nr = train.get_world_rank()",  # not a context's method
    "import raytrain_nb as train\nint = float\nr = int(train.get_context().get_world_rank())",  # int shadowed
    "from . import get_context\nr = get_context()",  # relative: not known
    "import mylib as train\nr = train.get_context().get_world_rank()",
    "def get_rank():\n    return 3\nr = get_rank()",
])
def test_other_values_are_not(cell):
    assert names(cell) == []


def test_statements_inside_blocks_and_functions_are_ignored():
    cell = """
import raytrain_nb as train
if True:
    a = train.get_context().get_world_rank()
for _ in range(1):
    b = train.get_context().get_world_rank()
def f():
    c = train.get_context().get_world_rank()
    return c
with open(__file__) as fh:
    d = train.get_context()
try:
    e = train.get_context()
except Exception:
    pass
while False:
    g = train.get_context()
class K:
    h = train.get_context()
"""
    assert names(cell) == [] and dependents(cell) == []


def test_a_name_shadowed_later_by_another_value_is_not_re_evaluated():
    setup = "import raytrain_nb as train\nrank = train.get_context().get_world_rank()\n"
    assert names(setup, "rank = 5") == []
    assert names(setup, "rank = rank + 1") == [] and dependents(setup, "rank = rank + 1") == ["rank"]
    assert names(setup, "rank += 1") == [] and dependents(setup, "rank += 1") == ["rank"]
    assert names(setup, "for rank in range(2):\n    pass") == []
    assert names(setup, "if x:\n    rank = 0") == []
    assert names(setup, "def rank():\n    pass") == []
    assert names(setup, "import rank") == []
    assert names(setup, "del rank") == []
    assert names(setup, "rank, other = f()") == []
    assert names(setup, "(rank := 3)") == []
    assert names(setup, "try:\n    pass\nexcept Exception as rank:\n    pass") == []


def test_the_latest_assignment_wins_in_history_order():
    p = plan("import os\nrank = 0", "rank = int(os.environ['RANK'])", "x = 1")
    assert p.names == ("rank",) and p.statements == ("rank = int(os.environ['RANK'])",)
    p = plan("import raytrain_nb as train\nctx = train.get_context()", "ctx = None")
    assert p.names == () and p.statements == ()


def test_a_context_rebound_later_is_re_evaluated_in_order():
    """``rank`` reads the first ``ctx``; ``ctx`` is then rebound: both statements run, in order."""
    p = plan("import raytrain_nb as train\nctx = train.get_context()\nrank = ctx.get_world_rank()",
             "from raytrain_nb import get_context\nctx = get_context()")
    assert p.names == ("rank", "ctx")
    assert p.statements == ("ctx = train.get_context()", "rank = ctx.get_world_rank()", "ctx = get_context()")


def test_an_earlier_statement_a_rank_value_needs_runs_even_when_its_own_name_was_rebound():
    p = plan("import raytrain_nb as train\nctx = train.get_context()\nrank = ctx.get_world_rank()\nctx = None")
    assert p.names == ("rank",)
    assert p.statements == ("ctx = train.get_context()", "rank = ctx.get_world_rank()")


def test_a_method_of_a_name_that_is_not_a_context_is_not_a_rank_value():
    assert names("import raytrain_nb as train\nctx = make()\nrank = ctx.get_world_rank()") == []
    assert names("import raytrain_nb as train\nctx = train.get_context()\nctx = make()\nr = ctx.get_world_rank()") == []
    assert names("import torch.distributed as dist\nr = dist.get_rank()\nx = r.get_world_rank()") == ["r"]


def test_dependents_are_named_transitively_and_cleared_when_rebound():
    setup = "import raytrain_nb as train\nrank = train.get_context().get_world_rank()\n" \
            "world_size = train.get_context().get_world_size()\n"
    assert dependents(setup + "is_main = rank == 0\nlr = base_lr * world_size\ndevice = f'cuda:{rank}'") == \
        ["is_main", "lr", "device"]
    assert dependents(setup + "lr = 0.1 * world_size\nopt_lr = lr / 2") == ["lr", "opt_lr"]
    assert dependents(setup + "lr = 0.1 * world_size", "lr = 0.01") == []
    assert dependents(setup + "if rank == 0:\n    is_main = True\nelse:\n    is_main = False") == ["is_main"]
    assert dependents(setup + "sampler = Sampler(num_replicas=world_size, rank=rank)") == ["sampler"]
    assert dependents(setup + "a, b = rank + 1, 2") == ["a"]
    assert dependents(setup + "x = 1\nfor batch in loader:\n    y = rank") == []


def test_a_tuple_with_some_rank_values_re_evaluates_only_those():
    p = plan("import raytrain_nb as train\nctx = train.get_context()\nrank, lr = ctx.get_world_rank(), 0.1")
    assert p.names == ("ctx", "rank") and p.statements[-1] == "rank = ctx.get_world_rank()"
    # A value that reads one of the tuple's own targets is not split out (it would read the new one).
    p = plan("import raytrain_nb as train\nctx = train.get_context()\nctx, r, lr = 1, ctx.get_world_rank(), 2")
    assert p.names == () and p.dependents == ("r",)


def test_cells_with_ipython_syntax_or_errors_still_count():
    assert names("%load_ext foo\nimport os\nrank = int(os.environ['RANK'])\n!ls") == ["rank"]
    assert names("import os\nrank = int(os.environ['RANK'])", "this is not python (") == ["rank"]


def test_the_getters_are_every_getter_of_the_context():
    # the trainer's metadata is the same on every rank; the storage and Tune's trial getters are refused
    not_rank_values = {"get_metadata", "get_storage", "get_trial_id", "get_trial_dir", "get_trial_resources"}
    assert CONTEXT_GETTERS == {n for n in vars(TrainContext) if n.startswith("get_")} - not_rank_values


# -- a rank runs them again ----------------------------------------------------------------------------------

class _Ctx:
    def __init__(self, rank, size):
        self.rank, self.size = rank, size

    def get_world_rank(self):
        return self.rank

    def get_world_size(self):
        return self.size


def _namespace(rank, size):
    train = types.SimpleNamespace(get_context=lambda: _Ctx(rank, size))
    return {"__builtins__": __builtins__, "train": train}


def test_a_rank_re_evaluates_with_its_new_context_and_keeps_only_the_names():
    p = plan("import raytrain_nb as train\nctx = train.get_context()\nrank = ctx.get_world_rank()\n"
             "world_size = train.get_context().get_world_size()\nctx = None")
    ns = dict(_namespace(2, 3), rank=1, world_size=2, ctx=None, is_main=False)
    out = reevaluate(ns, p.statements, p.names)
    assert out == {"set": ["rank", "world_size"], "failed": {}}
    assert (ns["rank"], ns["world_size"], ns["ctx"], ns["is_main"]) == (2, 3, None, False)


def test_a_statement_that_fails_names_its_reason_and_what_needed_it_fails_with_it():
    p = plan("import raytrain_nb as train\nctx = train.get_context()\nrank = ctx.get_world_rank()\n"
             "import torch.distributed as dist\nw = dist.get_world_size()")
    ns = dict(_namespace(0, 2), ctx="stale", rank=7)
    ns["train"] = types.SimpleNamespace(get_context=lambda: 1 / 0)
    out = reevaluate(ns, p.statements, p.names)
    assert out["set"] == []
    assert out["failed"] == {"ctx": "ZeroDivisionError: division by zero", "rank": "ZeroDivisionError: division by zero",
                             "w": "NameError: name 'dist' is not defined"}
    assert ns["rank"] == 7  # left as it was: the summary names it


# -- what the recovery says ----------------------------------------------------------------------------------

def test_the_summary_names_what_was_re_evaluated_and_what_was_not():
    text = RankValues(["rank", "world_size", "ctx"], ["is_main", "lr"]).summary()
    assert text == ("re-evaluated on every rank: rank, world_size, ctx; computed from them, not re-evaluated "
                    "(run their cells again): is_main, lr")
    assert RankValues().summary() == ""
    assert RankValues([], [], ["rank 1: rank (NameError: x)"]).summary() == "not re-evaluated on rank 1: rank (NameError: x)"


def test_a_history_without_rank_values_asks_no_worker():
    class NoSlots:
        def __iter__(self):
            raise AssertionError("no worker is asked when there is nothing to re-evaluate")

    rec = types.SimpleNamespace
    group = types.SimpleNamespace(history=[rec(source="x = 1"), rec(source="import os\nlr = 0.1")], slots=NoSlots(),
                                  rank_values=None)
    result = refresh_rank_values(group)
    assert group.rank_values is result and result.summary() == ""
    group.history.append(rec(source="import os\nrank = int(os.environ['RANK'])"))
    group.history.append(rec(source="rank = 3\nis_main = rank == 0"))
    assert refresh_rank_values(group).summary() == ""


def test_dist_restart_and_dist_rescale_print_the_summary(capsys):
    from raytrain_nb.notebook.magics_state import _report_replay  # IPython: the notebook layer's own test

    failures = ["rank 1: cell 2: ValueError: x"]

    def take_replay_failures():
        lines, failures[:] = list(failures), []
        return lines

    group = types.SimpleNamespace(rank_values=RankValues(["rank", "world_size", "ctx"], ["is_main", "lr"]),
                                  take_replay_failures=take_replay_failures)
    _report_replay(group)
    out = capsys.readouterr().out
    assert out.startswith("re-evaluated on every rank: rank, world_size, ctx; computed from them, not re-evaluated "
                          "(run their cells again): is_main, lr\n")
    assert "rank 1: cell 2: ValueError: x" in out and failures == []
    _report_replay(group)  # said once
    assert "ValueError" not in capsys.readouterr().out
