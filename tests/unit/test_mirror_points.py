"""Mirror points on a buddy: a refresh's mirror replaces a rank's older ones, mid-cell ones are staged beside the
point in use, and a late one (older than what the buddy keeps) is ignored; a rank takes one every K reports only."""
from __future__ import annotations

import torch

from raytrain_nb._internal.worker.mirroring import MirroringWorker


def _mirror(n):
    return {"modules": {"m": {"w": {"local": torch.zeros(n), "offset": (0,), "shape": (2 * n,)}}}, "optimizers": {}}


def test_a_buddy_keeps_the_point_in_use_and_the_staged_ones_and_ignores_late_ones():
    buddy = MirroringWorker()
    assert buddy.mirror_keep(0, _mirror(4), (1, 0)) == 16
    assert buddy.mirror_stage(0, (1, 1), _mirror(4), (1, 0)) == 16
    assert buddy.mirror_stage(0, (1, 2), _mirror(4), (1, 0)) == 16
    assert buddy.mirror_get(0, (1, 0)) is not None and buddy.mirror_get(0, (1, 2)) is not None
    assert buddy.mirror_stage(0, (1, 3), _mirror(4), (1, 2)) == 16  # (1, 2) in use now: older ones go
    assert buddy.mirror_get(0, (1, 0)) is None and buddy.mirror_get(0, (1, 1)) is None
    assert buddy.mirror_get(0, (1, 2)) is not None
    assert buddy.mirror_keep(0, _mirror(2), (2, 0)) == 8  # a refresh: a new epoch replaces every older point
    assert buddy.mirror_stage(0, (1, 4), _mirror(4), (1, 2)) == -1  # late, from before the refresh
    assert buddy.mirror_get(0, (1, 4)) is None and buddy.mirror_get(0, (2, 0)) is not None
    buddy.mirror_forget()
    assert buddy.mirror_get(0, (2, 0)) is None


class _Session:
    on_step = None


def test_a_rank_takes_a_mirror_every_k_reports_of_a_whole_group_cell_only():
    worker = MirroringWorker()
    worker.session, worker._partial, worker.rank, worker.namespace = _Session(), False, 0, {}
    worker._set_cadence(2)
    assert worker.session.on_step == worker._mirror_step
    worker.__dict__["_mirror_cadence"]["point"] = None
    worker._mirror_step(1)  # no refresh yet named a point: nothing to take
    worker.__dict__["_mirror_cadence"]["point"] = (1, 0)
    worker._partial = True
    worker._mirror_step(1)  # a cell on some ranks only
    worker._partial = False
    worker._mirror_step(0)  # not a K-th report
    assert worker._mirror_poll() == {}
    worker._set_cadence(0)
    assert worker.session.on_step is None
