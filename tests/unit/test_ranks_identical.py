"""The one check that every rank holds the same state (``tests/groups.py``), used by the integration tests."""
import numpy as np
import pytest
import torch

from ..groups import assert_ranks_identical, same_state, state_difference


def _state(shift: float = 0.0, step: int = 3):
    """What test_failures pulls: parameters, momentum buffers, the step."""
    return ([torch.ones(2, 2) + shift, torch.zeros(3)], [torch.full((2, 2), 0.5)], step)


def test_equal_states_pass_and_any_difference_is_named():
    assert_ranks_identical([_state(), _state(), _state()])
    assert_ranks_identical([_state()])  # one rank: nothing to differ from
    with pytest.raises(AssertionError, match=r"rank 2's params differs from rank 0's at \[0\]\[0\]: tensors differ"):
        assert_ranks_identical([_state(), _state(), _state(shift=1e-6)], "params")
    with pytest.raises(AssertionError, match=r"rank 1's state differs from rank 0's at \[2\]: 3 against 4"):
        assert_ranks_identical([_state(), _state(step=4)])


def test_shapes_lengths_keys_and_types_count():
    assert state_difference([torch.zeros(2)], [torch.zeros(3)]) == "[0]: tensors differ"
    assert state_difference([torch.zeros(2)], [torch.zeros(2), torch.zeros(1)]) == "the top: 1 items against 2"
    assert state_difference({"model": {"w": 1}}, {"model": {"b": 1}}) == "['model']: keys ['w'] against ['b']"
    assert state_difference({"model": {"w": torch.ones(1)}}, {"model": {"w": torch.zeros(1)}}) == \
        "['model']['w']: tensors differ"
    assert state_difference(torch.zeros(1), 0.0) == "the top: tensors differ"
    assert same_state((torch.Size([2, 3]), "x", None), (torch.Size([2, 3]), "x", None))


def test_arrays_compare_by_shape_and_value():
    """Keras weights come back as numpy arrays (test_tensorflow)."""
    weights = ([np.ones((2, 2)), np.zeros(2)], 7)
    assert same_state(weights, ([np.ones((2, 2)), np.zeros(2)], 7))
    assert not same_state(weights, ([np.ones((2, 2)), np.zeros(3)], 7))
    assert not same_state(np.ones(2), np.ones((1, 2)))  # equal after broadcasting is not equal
    assert not same_state(weights, ([np.ones((2, 2)), np.zeros(2)], 8))
