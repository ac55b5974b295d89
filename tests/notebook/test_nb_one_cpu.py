"""One CPU is enough: in a kernel whose embedded instance is told it has 1 CPU (as on Binder), two and four
workers share it with a note, train, and read Ray Data with preprocessing; five is the clear error it was."""
from __future__ import annotations

import pytest

from .nbkernel import Kernel, usage_error

pytestmark = [pytest.mark.notebook, pytest.mark.ray, pytest.mark.scripts]  # a kernel of its own, told 1 CPU

SHARE_NOTE = "the workers share its CPUs"


@pytest.fixture(scope="module")
def one_cpu(tmp_path_factory):
    k = Kernel(str(tmp_path_factory.mktemp("nb1cpu")), env={"RAYTRAIN_NB_NUM_CPUS": "1"})
    try:
        k.ok("%load_ext raytrain_nb")
        yield k
    finally:
        k.close()


def test_two_workers_share_one_cpu_train_and_read_ray_data(one_cpu):
    one_cpu.ok("import ray\n"
               "ds = ray.data.range(64).map_batches(lambda b: {'x': b['id'] / 64.0, 'y': 2.0 * b['id'] / 64.0})")
    cell = one_cpu.ok(
        "%%distributed --workers 2 --datasets train=ds\n"
        "import torch, raytrain_nb as train, raytrain_nb.torch\n"
        "rows = [r for b in train.get_dataset_shard('train').iter_batches(batch_format='numpy') for r in b['x']]\n"
        "model = train.torch.prepare_model(torch.nn.Linear(1, 1))\n"
        "opt = torch.optim.SGD(model.parameters(), lr=0.5)\n"
        "x = torch.tensor(rows, dtype=torch.float32)[:, None]\n"
        "losses = []\n"
        "for _ in range(30):\n"
        "    loss = ((model(x) - 2 * x) ** 2).mean(); opt.zero_grad(); loss.backward(); opt.step()\n"
        "    losses.append(loss.item())\n"
        "threads = torch.get_num_threads()\n"
        "summary = [len(rows), losses[-1] < losses[0] / 10, threads]")
    assert cell.stderr.count(SHARE_NOTE) == 1, cell.describe()
    assert "2 workers x 1 CPU = 2 CPU asked on a machine with 1" in cell.stderr
    one_cpu.ok("%dist_pull summary")
    # this rank's half of Ray Data's rows; it trained; one torch thread
    assert one_cpu.ok("summary").value == "[32, True, 1]"


def test_four_workers_share_it_too_and_five_are_refused(one_cpu):
    cell = one_cpu.ok("%dist_rescale 4")
    assert "4 workers x 1 CPU = 4 CPU asked on a machine with 1" in cell.stderr, cell.describe()
    world = one_cpu.ok("%%distributed\nimport raytrain_nb as train\nn = train.get_context().get_world_size()")
    assert world.status == "ok"
    one_cpu.ok("%dist_pull n")
    assert one_cpu.ok("n").value == "4"
    refused = usage_error(one_cpu.run("%dist_rescale 5"))
    assert refused.startswith("5 workers x 1 CPU = 5 CPU asked, but the cluster has 1 CPU: use fewer workers")
    assert one_cpu.ok("%%distributed\nn = train.get_context().get_world_size()").status == "ok"  # still 4, live
