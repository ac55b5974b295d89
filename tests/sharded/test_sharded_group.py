"""Sharded (FSDP2) models in a real group: prepare_model("fsdp2"), snapshots where each rank writes its own shards,
rollback in place, async snapshots, loading at another world size and into one process, and refusals.

One 2-rank group serves the module; full tensors are gathered on the workers (``full_tensor()``) to compare.
"""
from __future__ import annotations

import os
import pickle

import pytest
import torch

from raytrain_nb import WorkerGroup
from raytrain_nb._internal.errors import GroupError, WorkerError

from ..groups import MarkerSink, each_rank, quiet

#: A sharded model and its optimizer (a cell that does not train: a new rank replays it), and ``full()``, which
#: gathers the full parameters and AdamW moments (every rank joins the gathers).
BUILD = """
import torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
torch.manual_seed(0)
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.blocks = torch.nn.ModuleList([torch.nn.Linear(16, 16) for _ in range(3)])
        self.head = torch.nn.Linear(16, 2)
    def forward(self, x):
        for b in self.blocks:
            x = torch.relu(b(x))
        return self.head(x)
model = prepare_model(Net(), parallel_strategy="fsdp2")
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
model_id, opt_id = id(model), id(opt)
def full():
    params = {k: v.full_tensor().clone() for k, v in model.state_dict().items()}
    moments = {k: {n: (t.full_tensor() if hasattr(t, 'full_tensor') else t).clone() for n, t in s.items()}
               for k, s in enumerate(opt.state.values())}
    return params, moments
"""
TRAIN_FN = """
def train_steps(n):
    for _ in range(n):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
"""
SETUP = BUILD + TRAIN_FN + "train_steps(2)\n"


@pytest.fixture(scope="module")
def group(ray_session, tmp_path_factory):
    group = WorkerGroup(2, storage_path=str(tmp_path_factory.mktemp("runs")), name="sharded-run")
    quiet(group, SETUP)
    yield group
    group.shutdown()


def full_state(group):
    """Rank 0's gathered full parameters and AdamW moments (every rank joins the gathers)."""
    quiet(group, "_full = full()", setup=False)
    return group.pull("_full", rank=0)


def assert_same(a, b):
    params_a, moments_a = a
    params_b, moments_b = b
    assert params_a.keys() == params_b.keys()
    for k in params_a:
        assert torch.equal(params_a[k], params_b[k]), k
    for k in moments_a:
        for n in moments_a[k]:
            assert torch.equal(moments_a[k][n], moments_b[k][n]), (k, n)


def test_prepare_model_shards_each_child_and_the_root(group):
    out = each_rank(group, "(type(model).__name__, [type(b).__name__ for b in model.blocks], "
                           "type(model.head.weight).__name__, model.head.weight.to_local().shape[0], "
                           "model.head.weight.shape[0])")
    for name, blocks, cls, local, total in out:
        assert name == "FSDPNet" and blocks == ["FSDPLinear"] * 3 and cls == "DTensor"
        assert (local, total) == (1, 2)  # each rank holds half of the head's rows


def test_snapshot_writes_each_ranks_shards_and_rollback_loads_them_in_place(group):
    before = full_state(group)
    entry = group.checkpoint(name="sharded-a")
    files = sorted(os.listdir(os.path.join(entry.path, "sharded")))
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp"]
    quiet(group, "train_steps(3)")
    with pytest.raises(AssertionError):
        assert_same(before, full_state(group))
    group.rollback("sharded-a")
    assert_same(before, full_state(group))
    assert each_rank(group, "(id(model) == model_id, id(opt) == opt_id)") == [(True, True)] * 2
    quiet(group, "train_steps(1)")  # training goes on after the rollback


def test_an_interrupted_collective_keeps_each_ranks_shards_and_training_goes_on(group):
    """Ctrl-C while rank 0 waits in the backward's reduce-scatter re-forms the process group: the sharded model is
    moved onto it with the shards it held (no step was taken), then trains, snapshots and rolls back."""
    before = full_state(group)
    sink = MarkerSink("in the backward")
    cell = ("loss = model(torch.randn(8, 16)).pow(2).mean()\nimport time\nprint('in the backward', flush=True)\n"
            "if train.get_context().get_world_rank() == 1:\n    while True:\n        time.sleep(0.01)\n"
            "loss.backward()")
    background = group.run(cell, sink=sink, background=True)
    assert sink.seen.wait(60), "the ranks never reached the backward"
    group.interrupt()
    with pytest.raises(WorkerError) as info:
        background.wait(30)
    assert set(info.value.type_names) == {"KeyboardInterrupt"}
    assert each_rank(group, "(id(model) == model_id, id(opt) == opt_id)") == [(True, True)] * 2
    assert_same(before, full_state(group))
    entry = group.checkpoint(name="after-interrupt")
    quiet(group, "train_steps(2)")
    group.rollback(entry.name)
    assert_same(before, full_state(group))


def test_async_snapshot_copies_the_shards_then_writes_in_the_background(group):
    before = full_state(group)
    assert group.checkpoint(name="sharded-async", blocking=False) is None
    quiet(group, "train_steps(2)")  # runs while (or after) the write: the copy was taken before it
    group.rollback("sharded-async")
    assert_same(before, full_state(group))


def test_one_process_gathers_a_sharded_snapshot_for_inference(group, tmp_path):
    from raytrain_nb.torch import dcp_to_torch_save

    before = full_state(group)
    entry = group.checkpoint(name="sharded-one")
    out = tmp_path / "model.pt"
    dcp_to_torch_save(os.path.join(entry.path, "sharded"), str(out))
    state = torch.load(out, weights_only=True)
    for k, v in before[0].items():
        assert torch.equal(state["model"]["model"][k], v), k


def test_a_planted_metadata_is_refused_in_one_line(group, tmp_path):
    entry = group.checkpoint(name="sharded-planted")
    meta = os.path.join(entry.path, "sharded", ".metadata")
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (os.system, (f"touch {marker}",))

    size = os.path.getsize(meta)
    data = pickle.dumps(Evil())
    with open(meta, "wb") as fh:  # same size, so the commit manifest does not tell: the unpickler must
        fh.write(data + b"." * (size - len(data)))
    with pytest.raises(GroupError, match=r"posix.system, which is not one of DCP.s metadata classes"):
        group.rollback("sharded-planted")
    assert not marker.exists()


def test_a_2d_mesh_is_refused_in_one_line(group):
    quiet(group, """
from torch.distributed.device_mesh import init_device_mesh
try:
    prepare_model(torch.nn.Linear(2, 2), parallel_strategy="fsdp2",
                  parallel_strategy_kwargs={"mesh": init_device_mesh("cpu", (1, 2))})
    err = None
except ValueError as e:
    err = str(e)
""")
    out = group.pull("err", rank=0)
    assert "2-D mesh (1, 2) is not supported" in out and "\n" not in out


def test_pull_of_a_sharded_model_gathers_it_below_a_size_and_refuses_above(group, monkeypatch):
    from raytrain_nb._internal.group import mirrors

    params, _ = full_state(group)
    pulled = group.pull("model")
    assert pulled.keys() == params.keys() and all(torch.equal(pulled[k], params[k]) for k in params)
    monkeypatch.setattr(mirrors, "PULL_GATHER_MAX_BYTES", 100)
    with pytest.raises(GroupError, match=r"^'model' is sharded over 2 ranks and holds 0 MiB, more than the 0 MiB a "
                                         r"pull gathers: .*dcp_to_torch_save"):
        group.pull("model")


def test_status_shows_the_group_is_sharded_and_each_ranks_share(group):
    from raytrain_nb._internal.group.tables import format_status

    quiet(group, "train_steps(1)")  # a cell that trained: mirrored, shares known
    rows = group.status()
    assert [r.shard.split(":")[0] for r in rows] == ["fsdp2 1/2"] * 2 and all("MiB" in r.shard for r in rows)
    assert "cpu fsdp2 1/2: " in format_status(rows)


SHARDLIB = """
import torch
from torch.distributed.fsdp import fully_shard


def build():
    torch.manual_seed(1)
    net = torch.nn.Linear(512, 512)
    fully_shard(net)
    return net
"""


def _mib(group):
    return [float(r.shard.split(": ")[1].split(" MiB")[0]) for r in group.status()]


def test_a_model_sharded_by_the_users_own_package_is_mirrored_once_it_trains(group, tmp_path):
    # the cells never name fsdp2 or fully_shard, never report, and train no prepared model: each rank says its
    # shards stepped since their mirror, and the driver mirrors them
    (tmp_path / "shardlib.py").write_text(SHARDLIB)
    quiet(group, f"import sys\nsys.path.insert(0, {str(tmp_path)!r})\nimport shardlib\n"
                 "net = shardlib.build()\nnet_opt = torch.optim.AdamW(net.parameters(), lr=1e-2)")
    before = _mib(group)
    quiet(group, "loss = net(torch.randn(4, 512)).sum(); net_opt.zero_grad(); loss.backward(); net_opt.step()")
    after = _mib(group)
    # net's share on each rank: half of its 1 MiB of parameters and twice that in AdamW's moments
    assert all(a - b > 1.0 for a, b in zip(after, before)), (before, after)
