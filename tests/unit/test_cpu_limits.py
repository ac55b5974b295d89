"""The embedded instance sizes itself from the container's limits; a group asking up to 4x its CPUs shares them."""
from __future__ import annotations

import logging
import os
import tempfile

import pytest

from raytrain_nb._internal import cluster
from raytrain_nb._internal.group import placement
from raytrain_nb._internal.group.config import GroupConfig


def _files(monkeypatch, files):
    monkeypatch.setattr(cluster, "_read", lambda path: files.get(path, ""))


@pytest.mark.parametrize("files, cores, expected", [
    ({"/sys/fs/cgroup/cpu.max": "100000 100000"}, 16, 1),              # Binder: 1 CPU of quota on a big host
    ({"/sys/fs/cgroup/cpu.max": "max 100000"}, 16, 16),                # no quota: the cores it may run on
    ({"/sys/fs/cgroup/cpu.max": "150000 100000"}, 16, 2),              # 1.5 CPUs: rounded
    ({"/sys/fs/cgroup/cpu.max": "50000 100000"}, 16, 1),               # half a CPU: at least 1
    ({"/sys/fs/cgroup/cpu.max": "400000 100000"}, 2, 2),               # taskset narrower than the quota
    ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "200000",                 # cgroup v1
      "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"}, 16, 2),
    ({"/sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1",
      "/sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"}, 4, 4),
])
def test_cpu_limit_is_the_container_quota_not_the_host(monkeypatch, files, cores, expected):
    _files(monkeypatch, files)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)))
    assert cluster.cpu_limit() == expected


def test_the_settings_tell_the_embedded_instance_its_cpus_and_memory(monkeypatch):
    monkeypatch.setenv("RAYTRAIN_NB_NUM_CPUS", "1")
    monkeypatch.setenv("RAYTRAIN_NB_MEMORY_BYTES", str(2 * 1024 ** 3))
    monkeypatch.delenv("RAYTRAIN_NB_OBJECT_STORE_BYTES", raising=False)
    kwargs = cluster.local_init_kwargs()
    assert kwargs["num_cpus"] == 1.0
    assert kwargs["object_store_memory"] == 2 * 1024 ** 3 // 10


def test_without_settings_the_embedded_instance_takes_the_cpu_limit(monkeypatch):
    monkeypatch.delenv("RAYTRAIN_NB_NUM_CPUS", raising=False)
    monkeypatch.setattr(cluster, "cpu_limit", lambda: 3)
    assert cluster.local_init_kwargs()["num_cpus"] == 3.0


class _Ray:
    def __init__(self, cpus):
        self.cpus = cpus

    def cluster_resources(self):
        return {"CPU": self.cpus, "memory": 1e9}


@pytest.fixture
def embedded(monkeypatch):
    def make(cpus, ours=True):
        import sys

        monkeypatch.setitem(sys.modules, "ray", _Ray(cpus))
        monkeypatch.setattr(cluster, "started_by_us", lambda: ours)
    return make


@pytest.mark.parametrize("cpus, workers, per, shared", [
    (1, 2, 1, 0.0),      # Binder, --workers 2: nothing reserved, the one CPU left to Ray Data
    (1, 4, 1, 0.0),      # 4x: still shared
    (2, 3, 1, 0.333),    # all but one CPU, in equal parts
    (8, 3, 4, 2.333),
])
def test_a_group_asking_up_to_4x_the_cpus_shares_them_and_says_so(embedded, caplog, cpus, workers, per, shared):
    embedded(cpus)
    with caplog.at_level(logging.WARNING, logger=placement.__name__):
        config = placement.share_cpus(GroupConfig(num_workers=workers, cpus_per_worker=per), workers)
    assert config.cpus_per_worker == pytest.approx(shared, abs=1e-3)
    assert config.cpus_per_worker * workers <= max(0, cpus - 1) + 1e-9
    notes = [r.getMessage() for r in caplog.records]
    assert len(notes) == 1 and "share" in notes[0] and f"on a machine with {cpus:g}" in notes[0]
    assert config.placement_bundle()  # never an empty bundle, which Ray refuses


@pytest.mark.parametrize("cpus, workers, per, ours", [
    (1, 1, 1, True),     # fits: unchanged
    (1, 5, 1, True),     # beyond 4x: left to the feasibility error
    (1, 2, 1, False),    # an existing cluster: never shared
    (1, 2, 0, True),     # asks no CPU
])
def test_otherwise_the_config_is_unchanged(embedded, caplog, cpus, workers, per, ours):
    embedded(cpus, ours)
    config = GroupConfig(num_workers=workers, cpus_per_worker=per)
    with caplog.at_level(logging.WARNING, logger=placement.__name__):
        assert placement.share_cpus(config, workers) is config
    assert not caplog.records


def test_beyond_4x_the_request_stays_the_clear_error():
    from raytrain_nb._internal.errors import ResourceError

    with pytest.raises(ResourceError, match=r"^5 workers x 1 CPU = 5 CPU asked, but the cluster has 1 CPU: use fewer"):
        placement.check_feasible(GroupConfig(num_workers=5), 5, {"CPU": 1.0}, [])


def test_a_small_dev_shm_puts_the_object_store_in_the_temp_folder(monkeypatch):
    real = os.statvfs
    free_blocks = {"n": 16 * 1024}  # 64 MiB in 4 KiB blocks, Docker's and Binder's default /dev/shm

    class _Stat:
        f_frsize = 4096

        @property
        def f_bavail(self):
            return free_blocks["n"]

    monkeypatch.setattr(os, "statvfs", lambda path: _Stat() if path == cluster.SHARED_MEMORY else real(path))
    monkeypatch.setenv("RAYTRAIN_NB_MEMORY_BYTES", str(2 * 10**9))
    monkeypatch.delenv("RAYTRAIN_NB_OBJECT_STORE_BYTES", raising=False)
    kwargs = cluster.local_init_kwargs()
    assert kwargs["object_store_memory"] == 2 * 10**9 // 10
    assert kwargs["_plasma_directory"] == tempfile.gettempdir()  # not Ray's warning and a slow fallback
    free_blocks["n"] = 10**6  # 4 GB free: the store stays in shared memory
    assert "_plasma_directory" not in cluster.local_init_kwargs()
