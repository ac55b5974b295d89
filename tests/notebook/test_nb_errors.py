"""Every misuse of the magics answers at once with a one-line UsageError that says what to do.

Tests without a group come first; the module starts one group for the rest.
"""
from __future__ import annotations

import re

import pytest

from .nbkernel import START_TIMEOUT_S, usage_error

pytestmark = pytest.mark.notebook

#: Bad arguments never wait for resources: they are answered at once, measured submit -> reply.
ANSWER_S = 10.0


@pytest.fixture
def no_group(kernel):
    """The module's kernel with no live group (shuts one down if an earlier test left it)."""
    kernel.ok("import raytrain_nb as _rt\n_g = _rt.active_group()\nif _g is not None:\n    _g.shutdown()")
    return kernel


@pytest.fixture
def ray_up(no_group):
    """No group, but the kernel's Ray instance already running, so a timing measures the magic only."""
    no_group.ok("from raytrain_nb._internal import cluster\ncluster.connect()", timeout=START_TIMEOUT_S)
    return no_group


@pytest.fixture
def group(kernel):
    """The module's kernel with a live 2-worker group."""
    kernel.ensure_group("import raytrain_nb as train\nrank = train.get_context().get_world_rank()")
    return kernel


def _no_group_left(kernel) -> None:
    assert kernel.ok("import raytrain_nb as _rt\n_rt.active_group() is None").value == "True"


@pytest.mark.parametrize("line", ["%dist_status", "%dist_pull model", "%dist_pull model --all", "%dist_push lr",
                                  "%dist_reload mymod", "%dist_interrupt", "%dist_shutdown"])
def test_line_magics_before_any_group_say_how_to_start_one(no_group, line):
    no_group.ok("lr = 0.1")
    message = usage_error(no_group.run(line))
    assert message == "no distributed group yet: run a %%distributed cell first (it starts the workers)"


@pytest.mark.parametrize("flags, expected", [
    ("--workers 0", r"^num_workers=0 is not allowed: a group needs at least 1 worker \(--workers 1\)$"),
    ("--workers -1", r"^num_workers=-1 is not allowed: a group needs at least 1 worker \(--workers 1\)$"),
    ("--workers abc", r"^argument --workers/-n: invalid int value: 'abc'$"),
    ("--nodes 2", r"^unrecognized arguments: --nodes 2$"),
    ("--cpus -1", r"^cpus_per_worker=-1\.0 is not allowed: it must be 0 or more \(--cpus\)$"),
    ("--backend mpi", r"^argument --backend: invalid choice: 'mpi'"),
    ("--output some", r"^argument --output: invalid choice: 'some'"),
    ("--backend nccl", r"^backend='nccl' needs GPUs: add --gpus 1, or use --backend gloo on CPUs$"),
])
def test_bad_flags_answer_at_once_and_start_nothing(no_group, flags, expected):
    cell = no_group.run(f"%%distributed {flags}\nprint('ran')")
    assert re.search(expected, usage_error(cell)), usage_error(cell)
    assert cell.reply_t - cell.submitted < ANSWER_S
    assert "ran" not in cell.stdout
    _no_group_left(no_group)


@pytest.mark.parametrize("flags, asked", [
    ("--cpus 1000", r"^2 workers x 1000 CPU = 2000 CPU asked, but the cluster has 8 CPU: "
                    r"use fewer workers or a smaller --cpus$"),
    ("--workers 3 --gpus 1", r"^3 workers x 1 GPU = 3 GPU asked, but the cluster has 0 GPU: "
                             r"use fewer workers or a smaller --gpus$"),
])
@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_more_resources_than_the_cluster_has_fail_within_10s(ray_up, flags, asked):
    cell = ray_up.run(f"%%distributed {flags}\nprint('ran')", timeout=60)
    elapsed = cell.reply_t - cell.submitted
    assert elapsed < ANSWER_S, f"the resource error took {elapsed:.1f} s"
    assert re.search(asked, usage_error(cell)), usage_error(cell)
    _no_group_left(ray_up)
    # Nothing stays reserved: every CPU of the kernel's Ray instance is free again.
    free = ray_up.ok("import ray\nray.available_resources().get('CPU')").value
    assert free == "8.0"


@pytest.mark.parametrize("flags, differs", [
    ("--workers 3", "--workers 3 (the group has 2)"),
    ("--cpus 2", "--cpus 2.0 (the group has 1)"),
    ("--backend none", "--backend 'none' (the group has 'gloo')"),
])
def test_a_shaping_flag_unlike_the_live_group_points_at_rescale_and_shutdown(group, flags, differs):
    cell = group.run(f"%%distributed {flags}\nprint('ran')")
    message = usage_error(cell)
    assert message.startswith(f"the live group was started differently: {differs}"), message
    assert "%dist_rescale" in message and "%dist_shutdown" in message
    assert "ran" not in cell.stdout
    same = group.ok("%%distributed --workers 2 --cpus 1 --backend gloo\ntrain.get_context().get_world_size()")
    assert same.value == "2"


def test_bad_ranks(group):
    assert usage_error(group.run("%%distributed --ranks 5\npass")) == \
        "ranks [5] do not exist: the group has ranks 0..1"
    assert usage_error(group.run("%%distributed --ranks a\npass")) == \
        "--ranks 'a' is not a list of ranks: write e.g. --ranks 0,2"


def test_pull_of_a_missing_name_names_it_and_the_rank(group):
    fix = ": run the cell that defines it, or check the spelling"
    assert usage_error(group.run("%dist_pull nope")) == "name 'nope' is not defined on rank 0" + fix
    assert usage_error(group.run("%dist_pull nope --rank 1")) == "name 'nope' is not defined on rank 1" + fix
    assert usage_error(group.run("%dist_pull nope --all")) == "name 'nope' is not defined on rank 0, 1" + fix
    group.ok("%%distributed --ranks 1\nonly_on_1 = 1")
    assert usage_error(group.run("%dist_pull only_on_1 --all")) == "name 'only_on_1' is not defined on rank 0" + fix
    assert usage_error(group.run("%dist_pull rank --rank 0 --all")) == "use either --rank R or --all, not both"
    assert group.ok("'nope' in globals(), 'only_on_1' in globals()").value == "(False, False)"


def test_push_of_an_unpicklable_value_names_the_variable(group):
    group.ok("import threading\nlock = threading.Lock()\nfine = 1")
    message = usage_error(group.run("%dist_push fine lock"))
    assert re.match(r"^cannot push 'lock': a lock cannot be pickled \(.+\)$", message), message
    assert group.ok("%%distributed\n'fine' in globals()").value == "False"  # all or nothing
    cell = group.run("%%distributed --push lock\nprint('ran')")
    assert usage_error(cell).startswith("cannot push 'lock'")
    assert "ran" not in cell.stdout
    assert usage_error(group.run("%dist_push missing_one")) == \
        "name(s) missing_one not defined in the notebook: nothing was pushed"
