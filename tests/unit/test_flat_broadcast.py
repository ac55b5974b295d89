"""Which tensors share a packed broadcast (worker/flat_broadcast.py ``buckets``)."""
from __future__ import annotations

from raytrain_nb._internal.worker.flat_broadcast import buckets


def test_tensors_of_one_kind_share_a_bucket_up_to_its_cap():
    f32, f16 = ("float32", "cpu"), ("float16", "cpu")
    sizes = [(f32, 40), (f16, 10), (f32, 40), (f32, 40), (f16, 10)]
    assert buckets(sizes, cap=100) == [[0, 2], [1, 4], [3]]


def test_a_tensor_over_the_cap_goes_alone_and_the_rest_keep_filling():
    kind = ("float32", "cpu")
    assert buckets([(kind, 30), (kind, 500), (kind, 30)], cap=100) == [[0, 2], [1]]


def test_devices_of_another_kind_never_share_a_bucket():
    assert buckets([(("float32", "cpu"), 1), (("float32", "cuda"), 1)], cap=100) == [[0], [1]]


def test_nothing_to_send_is_no_collective():
    assert buckets([]) == []
