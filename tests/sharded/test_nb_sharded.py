"""The sharded round trips through the magics in a real Jupyter kernel: %%distributed builds and trains an FSDP2
model, %dist_status shows each rank's share, %dist_checkpoint / %dist_rollback restore the gathered full tensors,
and after a SIGKILL %dist_restart, then %dist_rescale 3 and %dist_rescale 2, rebuild every shard from the buddy
mirrors (the gathered full parameters and AdamW moments equal those at the last mirror point); training goes on.
With the mirrors off a lost rank is refused in one line, and %dist_restart --from-checkpoint restores the snapshot."""
from __future__ import annotations

import pytest

from .test_sharded_group import BUILD, TRAIN_FN
from ..notebook.nbkernel import START_TIMEOUT_S, Kernel, strip_ansi, usage_error

#: In the kernel: pull rank 0's gathered full state into ``name`` and compare two of them.
HELPERS = """
import os, signal, time, torch, raytrain_nb
def same(a, b):
    (pa, ma), (pb, mb) = a, b
    return pa.keys() == pb.keys() and all(torch.equal(pa[k], pb[k]) for k in pa) and all(
        torch.equal(ma[k][n], mb[k][n]) for k in ma for n in ma[k])
"""


def full_in_kernel(kernel, name):
    kernel.ok("%%distributed\n_full = full()")
    kernel.ok(f"%dist_pull _full\n{name} = _full")


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nb-sharded")
    k = Kernel(str(folder))
    try:
        k.ok("%load_ext raytrain_nb")
        k.ok(HELPERS)
        k.ok(f"%%distributed --workers 2 --storage {folder / 'runs'}\n{BUILD}", START_TIMEOUT_S)
        k.ok(f"%%distributed\n{TRAIN_FN}\ntrain_steps(2)")
        yield k
    finally:
        k.close()


def test_snapshot_rollback_restart_and_rescales_through_the_magics(kernel):
    status = strip_ansi(kernel.ok("%dist_status").stdout)
    assert status.count("fsdp2 1/2: ") == 2, status
    full_in_kernel(kernel, "saved")
    kernel.ok("%dist_checkpoint --name nb-1")  # written by 2 ranks: rolled back into 3 below (DCP reshards)
    kernel.ok("%%distributed\ntrain_steps(2)")
    full_in_kernel(kernel, "trained")
    assert kernel.ok("same(saved, trained)").value == "False"
    kernel.ok("%dist_rollback nb-1")
    full_in_kernel(kernel, "back")
    assert kernel.ok("same(saved, back)").value == "True"

    kernel.ok("%%distributed\ntrain_steps(1)")  # trained: mirrored at its end
    full_in_kernel(kernel, "mirrored")
    kernel.ok("g = raytrain_nb.active_group(); os.kill(g.status()[1].pid, signal.SIGKILL)\n"
              "t0 = time.monotonic()\nwhile g.status()[1].state != 'dead':\n"
              "    assert time.monotonic() - t0 < 60, 'rank 1 not seen dead'\n    time.sleep(0.2)")
    kernel.ok("%dist_restart", START_TIMEOUT_S)
    full_in_kernel(kernel, "restarted")
    assert kernel.ok("same(mirrored, restarted)").value == "True"
    for size in (3, 2):
        kernel.ok("%%distributed\ntrain_steps(1)")
        full_in_kernel(kernel, "mirrored")
        kernel.ok(f"%dist_rescale {size}", START_TIMEOUT_S)
        full_in_kernel(kernel, "rescaled")
        assert kernel.ok("same(mirrored, rescaled)").value == "True", size
        status = strip_ansi(kernel.ok("%dist_status").stdout)
        assert status.count(f"fsdp2 1/{size}: ") == size, status
        # a snapshot of 2 ranks into 3; then into 2 ranks re-sharded from 3 (load_state_dict runs no hook of an
        # old layout: one left by the 3-rank FSDP copied an 8-row shard into its 6-row one)
        kernel.ok("%dist_rollback nb-1")
        full_in_kernel(kernel, "back")
        assert kernel.ok("same(saved, back)").value == "True", size
    kernel.ok("%%distributed\ntrain_steps(1)")  # training goes on


def test_with_the_mirrors_off_a_lost_rank_is_refused_in_one_line_and_restarts_from_a_snapshot(kernel):
    kernel.ok("%dist_checkpoint --name nb-2")
    full_in_kernel(kernel, "saved2")
    kernel.ok("g = raytrain_nb.active_group(); g.mirror_shards(False)\nos.kill(g.status()[1].pid, signal.SIGKILL)\n"
              "t0 = time.monotonic()\nwhile g.status()[1].state != 'dead':\n"
              "    assert time.monotonic() - t0 < 60, 'rank 1 not seen dead'\n    time.sleep(0.2)")
    error = usage_error(kernel.run("%dist_restart"))  # one line, no traceback
    assert error.startswith("the shards of rank(s) 1 are gone: mirrors of shards are off") and \
        "--from-checkpoint" in error, error
    kernel.ok("%dist_restart --from-checkpoint nb-2", START_TIMEOUT_S)  # every rank re-shards, then loads it
    full_in_kernel(kernel, "loaded")
    assert kernel.ok("same(saved2, loaded)").value == "True"
    kernel.ok("%%distributed\ntrain_steps(1)")
