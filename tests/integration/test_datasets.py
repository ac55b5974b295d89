"""Ray Data in the notebook path: ``%%distributed --datasets train=ds`` / ``group.attach_datasets``, re-split on rescale."""
from __future__ import annotations

import pytest

import raytrain_nb
from raytrain_nb import WorkerError

pytestmark = pytest.mark.ray

READ = ("import raytrain_nb as train\n"
        "ids = sorted(int(i) for b in train.get_dataset_shard('train').iter_batches(batch_format='numpy') "
        "for i in b['id'])")


def test_datasets_flag_splits_disjoint_and_a_rescale_splits_again(ray_session):
    from IPython.core.error import UsageError
    from IPython.core.interactiveshell import InteractiveShell

    ip = InteractiveShell.instance()
    group = None
    try:
        ip.extension_manager.load_extension("raytrain_nb")
        ip.user_ns["ds"] = ray_session.data.range(40)
        with pytest.raises(UsageError, match=r"--datasets 'train': write name=variable pairs"):
            ip.run_cell_magic("distributed", "--workers 2 --backend none --datasets train", "pass")
        ip.run_cell_magic("distributed", "--workers 2 --backend none --datasets train=ds", READ)
        group = raytrain_nb.active_group()
        a, b = group.pull("ids", rank=None)
        assert not set(a) & set(b) and sorted(a + b) == list(range(40)) and len(a) == len(b) == 20
        with pytest.raises(UsageError, match=r"--datasets: nope not defined in the notebook"):
            ip.run_cell_magic("distributed", "--datasets val=nope", "pass")
        group.rescale(1)  # the group splits the datasets again for the new size
        group.run(READ)
        assert group.pull("ids") == list(range(40))
        with pytest.raises(WorkerError, match=r"no dataset named 'val'; the datasets given are train"):
            group.run("train.get_dataset_shard('val')")
    finally:
        if group is not None:
            group.shutdown()
        InteractiveShell.clear_instance()
