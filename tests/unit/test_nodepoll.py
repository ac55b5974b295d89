"""Which ranks are polled through a node's leader (group/nodepoll.py), without Ray."""
from raytrain_nb._internal.group.nodepoll import NODE_POLL_MIN_RANKS, node_groups


def test_nodes_with_several_ranks_are_polled_through_their_lowest_rank_once_the_cell_is_big_enough():
    assert NODE_POLL_MIN_RANKS == 4
    assert node_groups({0: "a", 1: "a", 2: "b"}) == ({}, [0, 1, 2])  # few ranks: one call each
    groups, direct = node_groups({0: "a", 5: "b", 1: "a", 3: "b", 4: "c", 2: "a"})
    assert groups == {0: [0, 1, 2], 3: [3, 5]} and direct == [4]
