"""The spare buffers a background snapshot's copy reuses (worker/copy_pool.py)."""
import torch

from raytrain_nb._internal.worker.copy_pool import CopyPool
from raytrain_nb._internal.worker.snapshot import cpu_state, tensors_of


def test_a_copy_goes_into_a_spare_of_its_shape_and_dtype_and_is_a_copy():
    pool = CopyPool()
    src = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    first = pool.copy(src)
    assert torch.equal(first, src) and first.data_ptr() != src.data_ptr()
    pool.refill([first])
    src.add_(1)
    second = pool.copy(src)
    assert second.data_ptr() == first.data_ptr(), "the spare is reused"
    assert torch.equal(second, src)
    src.add_(1)
    assert not torch.equal(second, src), "a copy does not follow the source"
    third = pool.copy(src)  # the one spare is taken: new memory
    assert third.data_ptr() != second.data_ptr() and torch.equal(third, src)


def test_another_shape_or_dtype_gets_new_memory_and_refill_replaces_the_spares():
    pool = CopyPool()
    a = pool.copy(torch.zeros(4))
    pool.refill([a])
    assert pool.nbytes == 16
    b = pool.copy(torch.zeros(4, dtype=torch.float64))
    c = pool.copy(torch.zeros(5))
    assert a.data_ptr() not in (b.data_ptr(), c.data_ptr())
    pool.refill([b, c])
    assert pool.nbytes == 4 * 8 + 5 * 4  # a is no longer kept
    pool.clear()
    assert pool.nbytes == 0


def test_a_nested_state_is_copied_through_the_pool():
    pool = CopyPool()
    model = torch.nn.Linear(3, 2)
    first = cpu_state(model.state_dict(), pool=pool)
    pool.refill(tensors_of(first))
    with torch.no_grad():
        model.weight.fill_(7.0)
    second = cpu_state(model.state_dict(), pool=pool)
    assert {t.data_ptr() for t in tensors_of(second)} == {t.data_ptr() for t in tensors_of(first)}
    assert torch.equal(second["weight"], torch.full((2, 3), 7.0))
    assert second["weight"].data_ptr() != model.weight.data_ptr()
