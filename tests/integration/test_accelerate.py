"""Accelerate on a CPU group: ``Accelerator(fsdp_plugin=...)``, which Accelerate ignores on the CPU, is refused in
one line naming FSDP2, in cells (also in a restarted worker's new process) and in ``TorchTrainer.fit()``; the group
goes on and a plain ``Accelerator()`` trains on it."""
from __future__ import annotations

import os
import signal

import pytest

from raytrain_nb import NotSupportedError, RunConfig, ScalingConfig, WorkerError, WorkerGroupError
from raytrain_nb.torch import TorchTrainer

from ..groups import quiet, set_up_group
from ..waiting import wait_for

pytest.importorskip("accelerate")
pytestmark = pytest.mark.ray

SETUP = "from accelerate import Accelerator, FullyShardedDataParallelPlugin\nimport torch"
FSDP_CELL = "acc = Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))"
REFUSAL = ("NotSupportedError: Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)): Accelerate "
           "ignores its FSDP plugin on CPU: shard with prepare_model(model, parallel_strategy='fsdp2') "
           "(raytrain_nb.torch), or run on GPUs (--gpus 1, ScalingConfig(use_gpu=True))")
PLAIN = """
acc = Accelerator()
net = torch.nn.Linear(4, 1)
model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
loss = model(torch.randn(8, 4)).pow(2).mean(); acc.backward(loss); opt.step()
seen = (acc.num_processes, acc.process_index, str(acc.distributed_type))
"""


def _refused(group):
    with pytest.raises(WorkerError) as info:
        quiet(group, FSDP_CELL)
    assert str(info.value) == f"[rank 0, 1] {REFUSAL}"
    assert info.value.render().count("NotSupportedError") == 1 and "_internal" not in info.value.render()
    assert all(type(e) is NotSupportedError for e in info.value.exceptions.values())


def test_an_fsdp_plugin_is_refused_in_one_line_and_the_group_goes_on(ray_session):
    with set_up_group(SETUP) as group:
        _refused(group)
        assert quiet(group, "1 + 1").value == "2"  # the next cell runs
        # refused before Accelerate set ACCELERATE_USE_FSDP: a plain one is not refused. Not a setup cell: a new
        # rank replaying Accelerator() before it joins the group would wait for a process group of Accelerate's own
        quiet(group, PLAIN, setup=False)
        assert group.pull("seen", rank=None) == [(2, 0, "DistributedType.MULTI_CPU"),
                                                 (2, 1, "DistributedType.MULTI_CPU")]
        # a restarted rank is a new process: its setup installs the check again before the replayed import
        quiet(group, "del acc, net, model, opt, loss", setup=False)
        pid = group.status()[1].pid
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: group.state == "failed", 10.0, "the killed rank to be noticed")
        assert group.restart() == [1]
        assert group.status()[1].pid != pid
        _refused(group)
        quiet(group, PLAIN, setup=False)
        assert group.pull("seen", rank=None)[1] == (2, 1, "DistributedType.MULTI_CPU")


def test_trainer_fit_refuses_it_the_same_way(ray_session, tmp_path):
    def train_func():
        from accelerate import Accelerator, FullyShardedDataParallelPlugin  # in the worker

        Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2))

    trainer = TorchTrainer(train_func, scaling_config=ScalingConfig(num_workers=1),
                           run_config=RunConfig(name="accelerate-fsdp", storage_path=str(tmp_path)))
    with pytest.raises(WorkerGroupError) as info:
        trainer.fit()
    error = info.value.worker_failures[0]
    assert type(error) is NotSupportedError and f"NotSupportedError: {error}" == REFUSAL
