"""What Ray Train's torch arguments mean here, in real 2-rank groups: ``prepare_model(parallel_strategy="fsdp")``
wraps in FSDP1's ``FullyShardedDataParallel`` with the given kwargs (on CPUs with gloo too), and
``TorchConfig(timeout_s=...)`` is the process group's timeout."""
from __future__ import annotations

import sys
import time

import pytest
import torch

from raytrain_nb import RunConfig, ScalingConfig, WorkerGroupError
from raytrain_nb.torch import TorchConfig, TorchTrainer

from ..groups import pickled_by_value

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module", autouse=True)
def by_value(ray_session):
    """Workers get this module's loop functions by value (they need not import the tests package)."""
    with pickled_by_value(sys.modules[__name__]):
        yield


def fsdp_loop(config):
    import raytrain_nb as train
    from raytrain_nb.torch import prepare_model

    torch.manual_seed(0)
    model = prepare_model(torch.nn.Linear(8, 4), parallel_strategy="fsdp",
                          parallel_strategy_kwargs={"forward_prefetch": True})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(3):
        torch.manual_seed(step * 10 + train.get_context().get_world_rank())
        loss = model(torch.randn(16, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        train.report({"step": step, "loss": loss.item()})
    return {"type": type(model).__name__, "forward_prefetch": model.forward_prefetch,
            "local_numel": sum(p.numel() for p in model.parameters()), "losses": losses,
            "metadata": train.get_context().get_metadata()}


def test_fsdp_keeps_ray_trains_meaning_in_a_two_rank_gloo_group(tmp_path):
    result = TorchTrainer(fsdp_loop, scaling_config=ScalingConfig(num_workers=2), metadata={"tag": "fsdp"},
                          run_config=RunConfig("fsdp", str(tmp_path), verbose=0)).fit()
    value = result.return_value
    assert value["metadata"] == {"tag": "fsdp"}  # ours: Ray Train V2 refuses metadata=
    assert value["type"] == "FullyShardedDataParallel" and value["forward_prefetch"] is True
    assert value["local_numel"] == (8 * 4 + 4) // 2  # each of the 2 ranks holds half of the flat parameter
    assert value["losses"][-1] < value["losses"][0], value["losses"]


def late_rank_loop():
    import torch.distributed as dist

    import raytrain_nb as train

    if train.get_context().get_world_rank() == 1:
        time.sleep(5)  # rank 0 waits in the barrier for this rank longer than the timeout
    dist.barrier()


def test_torch_config_timeout_is_the_process_groups_timeout(tmp_path):
    trainer = TorchTrainer(late_rank_loop, torch_config=TorchConfig("gloo", timeout_s=2),
                           scaling_config=ScalingConfig(num_workers=2),
                           run_config=RunConfig("timeout", str(tmp_path), verbose=0))
    started = time.monotonic()
    with pytest.raises(WorkerGroupError, match=r"(?s)rank 0.*Timed out"):
        trainer.fit()
    # the barrier gave up after 2 s, not the default 1800 s
    assert time.monotonic() - started < 60
