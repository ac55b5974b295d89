from raytrain_nb._internal.group.ranks import assign_ranks, rank_infos


def test_ranks_grouped_by_node_driver_first():
    nodes = ["b", "a", "b", "a"]
    order = assign_ranks(nodes, driver_node="a")
    assert order == [1, 3, 0, 2]
    infos = rank_infos([nodes[i] for i in order])
    assert [(i.world_rank, i.local_rank, i.local_world_size, i.node_rank) for i in infos] == [
        (0, 0, 2, 0), (1, 1, 2, 0), (2, 0, 2, 1), (3, 1, 2, 1)]
    assert all(i.world_size == 4 for i in infos)


def test_rank_env_variables():
    info = rank_infos(["n", "n"])[1]
    env = info.env("10.0.0.1", 29500)
    assert env == {"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
                   "NODE_RANK": "0", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}


def test_unknown_driver_node_keeps_first_seen_order():
    assert assign_ranks(["x", "y", "x"], driver_node="z") == [0, 2, 1]
