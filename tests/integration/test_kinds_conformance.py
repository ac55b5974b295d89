"""The same restart, rescale, snapshot and rollback checks against every group kind (in the style of fsspec's
abstract tests): a torch process group (gloo), peers copied through the driver (none, XGBoost, LightGBM) and
fresh processes for every rank (TensorFlow; its share kept to a restart: its processes are slow to start).
A ``none`` group's state is plain variables (what the driver copies for it; its torch modules are each rank's
own, as without a process group nothing says they are replicas).

Each kind gives three cells: ``setup`` (replayed by new ranks), ``train`` (grows the state every rank holds
alike) and ``digest`` (a bytes value of that state, the same on every rank when they agree)."""
from __future__ import annotations

import dataclasses
import importlib.util
import os
import signal

import pytest

from raytrain_nb import WorkerGroup
from raytrain_nb._internal.group.kinds import FreshProcesses, PeersThroughDriver, TorchProcessGroup
from raytrain_nb._internal.group.plans import plan_recovery

from ..groups import quiet
from ..waiting import wait_for


@dataclasses.dataclass(frozen=True)
class Kind:
    backend: str
    kind: type
    setup: str
    train: str
    digest: str
    module: str = ""
    only_restart: bool = False
    snapshot_vars: tuple = ()


TORCH_SETUP = """
import hashlib, torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
torch.manual_seed(0)
model = prepare_model(torch.nn.Linear(4, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
"""
TORCH_TRAIN = """
g = torch.Generator().manual_seed(7)
for _ in range(3):
    loss = model(torch.randn(8, 4, generator=g)).pow(2).mean(); opt.zero_grad(); loss.backward(); opt.step()
train.report({"loss": loss.item()})
"""
TORCH_DIGEST = "hashlib.sha1(b''.join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest()"

BOOST_SETUP = """
import hashlib, numpy as np, raytrain_nb as train
rank = train.get_context().get_world_rank()
x = np.random.default_rng(rank).normal(size=(100, 3)); y = x @ np.array([1.0, -2.0, 0.5])
"""

KINDS = [
    Kind("gloo", TorchProcessGroup, TORCH_SETUP, TORCH_TRAIN, TORCH_DIGEST),
    Kind("none", PeersThroughDriver, "import hashlib\nweights = [0.0] * 4\n",
         "weights = [w + 0.5 * (i + 1) for i, w in enumerate(weights)]\n",
         "hashlib.sha1(repr(weights).encode()).hexdigest()", snapshot_vars=("weights",)),
    Kind("xgboost", PeersThroughDriver, BOOST_SETUP + "import xgboost\nbst = None\n",
         "bst = xgboost.train({'max_depth': 2}, xgboost.DMatrix(x, label=y), 2, xgb_model=bst)\n",
         "hashlib.sha1(bytes(bst.save_raw('ubj'))).hexdigest()", module="xgboost"),
    Kind("lightgbm", PeersThroughDriver,
         BOOST_SETUP + "import lightgbm\nfrom raytrain_nb.lightgbm import get_network_params\nrounds = 1\n",
         "rounds += 1\nbst = lightgbm.train(dict(get_network_params(), objective='regression', verbose=-1, "
         "num_leaves=4, min_data_in_leaf=5), lightgbm.Dataset(x, label=y), rounds)\n",
         # the ranks' trees agree in shape, not to the bit (LightGBM's leaf values differ in the last digits)
         "repr((rounds, bst.current_iteration(), bst.num_trees()))", module="lightgbm", snapshot_vars=("rounds",)),
    Kind("tensorflow", FreshProcesses,
         "import hashlib, numpy as np, tensorflow as tf\nstrategy = tf.distribute.MultiWorkerMirroredStrategy()\n"
         "with strategy.scope():\n    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(3,))])\n"
         "    model.compile(optimizer='sgd', loss='mse')\n",
         "model.fit(np.ones((8, 3)), np.ones((8, 1)), epochs=1, batch_size=4, verbose=0)\n",
         "hashlib.sha1(b''.join(w.tobytes() for w in model.get_weights())).hexdigest()",
         module="tensorflow", only_restart=True),
]


def _available(kind: Kind) -> bool:
    return not kind.module or importlib.util.find_spec(kind.module) is not None


@pytest.fixture(scope="module", params=[k for k in KINDS], ids=[k.backend for k in KINDS])
def kinded(request, ray_session):
    kind = request.param
    if not _available(kind):
        pytest.skip(f"{kind.module} is not installed")
    group = WorkerGroup(2, backend=kind.backend, cpus_per_worker=0.5)
    try:
        quiet(group, kind.setup, setup=True)
        quiet(group, kind.train)
        yield kind, group
    finally:
        group.shutdown()


def digests(group: WorkerGroup, kind: Kind) -> list:
    out = quiet(group, f"_digest = {kind.digest}\n_digest", output="all")
    return [out.values[r][0]["text/plain"] for r in sorted(out.values)]


def kill(group: WorkerGroup, rank: int) -> None:
    os.kill(group.status()[rank].pid, signal.SIGKILL)
    wait_for(lambda: group.status()[rank].state == "dead", 30, f"rank {rank}'s death to be noticed")


def test_the_kind_is_chosen_once_from_the_backend(kinded):
    kind, group = kinded
    assert type(group.kind) is kind.kind and group.kind.name == kind.backend


def test_a_killed_rank_restarts_with_its_peers_state(kinded):
    kind, group = kinded
    before = digests(group, kind)
    assert len(set(before)) == 1
    kill(group, 1)
    plan = plan_recovery(group.kind, "restart", live=[0], gone=[1])
    assert group.restart() == [1]
    assert digests(group, kind) == before  # the new rank holds what its peer held, and nothing trained meanwhile
    # the plan that ran is the plan for this kind, every step of it timed
    timings = group.last_recovery
    assert timings.operation == "restart" and [name for name, _ in timings.steps] == [type(step).__name__ for step in plan.steps]
    assert all(seconds >= 0 for _, seconds in timings.steps) and timings.total_s > 0
    quiet(group, kind.train)
    after = digests(group, kind)
    assert len(set(after)) == 1 and after != before  # and they train on together


def test_rescale_down_and_up_keeps_the_state_on_every_rank(kinded):
    kind, group = kinded
    if kind.only_restart:
        pytest.skip("fresh processes: restart only (slow to start)")
    before = digests(group, kind)
    group.rescale(1)
    assert digests(group, kind) == before[:1]
    group.rescale(2)
    assert digests(group, kind) == before
    quiet(group, kind.train)
    assert len(set(digests(group, kind))) == 1


def test_a_snapshot_rolls_back_on_every_rank(kinded):
    kind, group = kinded
    if kind.only_restart:
        pytest.skip("fresh processes: restart only (slow to start)")
    group.checkpoint(f"conformance-{kind.backend}", vars=kind.snapshot_vars)
    saved = digests(group, kind)
    quiet(group, kind.train)
    assert digests(group, kind) != saved
    group.rollback(f"conformance-{kind.backend}")
    assert digests(group, kind) == saved
