import pytest

from raytrain_nb._internal.errors import GroupError, ResourceError
from raytrain_nb._internal.group.config import GroupConfig
from raytrain_nb._internal.group.placement import check_feasible


@pytest.mark.parametrize("kwargs,match", [
    ({"num_workers": 0}, r"num_workers=0 is not allowed.*at least 1"),
    ({"num_workers": -1}, r"num_workers=-1 is not allowed"),
    ({"num_workers": "abc"}, r"num_workers='abc' is not a whole number"),
    ({"num_workers": 2.5}, r"num_workers=2.5 is not a whole number"),
    ({"cpus_per_worker": -1}, r"cpus_per_worker=-1 is not allowed.*--cpus"),
    ({"gpus_per_worker": "x"}, r"gpus_per_worker='x' is not a number"),
    ({"gpus_per_worker": 1.5}, r"gpus_per_worker=1.5"),
    ({"placement_strategy": "RANDOM"}, r"placement_strategy='RANDOM' is unknown"),
    ({"backend": "mpi"}, r"backend='mpi' is unknown"),
    ({"backend": "nccl"}, r"backend='nccl' needs GPUs"),
    ({"resources_per_worker": {"CPU": 2}}, r"use cpus_per_worker"),
])
def test_bad_config_is_one_clear_line(kwargs, match):
    with pytest.raises(GroupError, match=match) as info:
        GroupConfig(**kwargs)
    assert "\n" not in str(info.value)


def test_backend_defaults_follow_gpus():
    assert GroupConfig().resolved_backend == "gloo"
    assert GroupConfig(gpus_per_worker=1).resolved_backend == "nccl"
    assert GroupConfig(gpus_per_worker=1, backend="gloo").resolved_backend == "gloo"
    assert GroupConfig(cpus_per_worker=2, gpus_per_worker=1, resources_per_worker={"TPU": 0}).bundle() == \
        {"CPU": 2.0, "GPU": 1.0}


def test_infeasible_request_names_asked_and_available():
    with pytest.raises(ResourceError, match=r"4 workers x 1 GPU = 4 GPU asked, but the cluster has 2 GPU"):
        check_feasible(GroupConfig(num_workers=4, gpus_per_worker=1), 4, {"CPU": 16, "GPU": 2}, [])
    with pytest.raises(ResourceError, match=r"2 workers x 1000 CPU = 2000 CPU asked, but the cluster has 8 CPU"):
        check_feasible(GroupConfig(num_workers=2, cpus_per_worker=1000), 2, {"CPU": 8}, [])
    with pytest.raises(ResourceError, match="more than any single node has"):
        check_feasible(GroupConfig(num_workers=1, cpus_per_worker=6), 1, {"CPU": 8}, [{"CPU": 4}, {"CPU": 4}])
    check_feasible(GroupConfig(num_workers=2), 2, {"CPU": 2}, [{"CPU": 2}])
