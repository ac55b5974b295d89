"""The soak's sharded (FSDP2) style without Ray: the digest of a model joined from every rank's shards, the checks on
each rank's shard, what the soak expects of the buddy mirrors, and the cells the style sends."""
from __future__ import annotations

import hashlib
from collections import Counter
from typing import Any, Dict, List

import pytest
import torch

from raytrain_nb._internal.group.plans import LOST_SHARDS
from soak import digest, programs
from soak.ledger import compare_ranks
from soak.shards import MirrorWatch, lost_shards


def shard_of(full: torch.Tensor, rank: int, world: int, **changes: Any) -> Dict[str, Any]:
    """What :func:`digest.soak_split` gives for rank ``rank``'s ``Shard(0)`` piece of ``full`` (as torch.chunk)."""
    chunk = -(-full.shape[0] // world)
    local = full[rank * chunk:(rank + 1) * chunk].contiguous()
    part = {digest.SOAK_SHARD: 1, "dtype": str(full.dtype), "shape": list(full.shape),
            "local_shape": list(local.shape), "mesh": [world, 1], "coord": rank, "placements": ["Shard(0)"],
            "bytes": local.reshape(-1).view(torch.uint8).numpy().tobytes() if local.numel() else b""}
    part.update(changes)
    return part


def parts(state: Dict[str, Any], world: int, rank: int, **changes: Any) -> Dict[str, Any]:
    """One rank's ``soak_parts`` entry for a sharded ``state`` (tensors sharded, the step count plain)."""
    def split(t: torch.Tensor) -> Any:
        return shard_of(t, rank, world, **changes) if t.dim() else digest.soak_split(t)

    return {digest.SOAK_SHARD: digest.soak_map(state, split)}


STATE = {"state": {"0.weight": {"step": torch.tensor(3.0), "exp_avg": torch.randn(5, 4)}},
         "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": ["0.weight"]}]}


@pytest.mark.parametrize("world", [1, 2, 3])
def test_a_model_joined_from_every_ranks_shards_has_the_digest_of_its_full_state(world: int) -> None:
    per_rank = [{"opt": parts(STATE, world, r), "ballast": "abc"} for r in range(world)]
    merged = digest.soak_merge(per_rank)
    assert [m["opt"] for m in merged] == [digest.soak_digest(STATE)] * world
    assert [m["ballast"] for m in merged] == ["abc"] * world
    assert compare_ranks(merged) == ([], [])


@pytest.mark.parametrize("change, why", [
    ({"local_shape": [3, 4]}, "its local shard is [3, 4], not [2, 4]"),
    ({"coord": 0}, "it is number 0 of a mesh of [3, 1]"),
    ({"mesh": [2, 1]}, "of a mesh of [2, 1] (size, dims), not 1 of 3 ranks"),
    ({"placements": ["_StridedShard(0)"]}, "placements ['_StridedShard(0)'], not [Shard(0)]"),
    ({"shape": [6, 4]}, "its global shape or dtype [6, 4]"),
])
def test_a_rank_whose_shard_is_not_the_one_fsdp2_gives_it_makes_the_ranks_differ(change: Dict[str, Any],
                                                                                   why: str) -> None:
    per_rank = [{"opt": parts(STATE, 3, r, **(change if r == 1 else {}))} for r in range(3)]
    merged = digest.soak_merge(per_rank)
    differ, _ = compare_ranks(merged)
    assert differ == ["opt"]
    assert all(m["opt"].startswith("!opt['state']['0.weight']['exp_avg']: rank 1: ") for m in merged)
    assert why in merged[0]["opt"]


def test_a_plain_tensor_that_differs_across_ranks_and_a_path_sharded_on_some_ranks_only_are_caught() -> None:
    other = {**STATE, "state": {"0.weight": {**STATE["state"]["0.weight"], "step": torch.tensor(4.0)}}}
    merged = digest.soak_merge([{"opt": parts(STATE, 2, 0)}, {"opt": parts(other, 2, 1)}])
    assert "a plain tensor differs across ranks" in merged[0]["opt"] and merged[0]["opt"] != merged[1]["opt"]
    merged = digest.soak_merge([{"opt": parts(STATE, 2, 0)}, {"opt": "plain"}])
    assert [m["opt"] for m in merged] == [f"!opt is sharded on ranks [0] only [rank {r}]" for r in range(2)]


def test_canon_refuses_a_dtensor_and_takes_a_hashed_leaf_as_the_tensors_digest() -> None:
    class DTensor:  # the name is what is checked: reshaping a real one would be a collective
        def to_local(self) -> None:
            """Never called."""

    with pytest.raises(TypeError, match="must be gathered"):
        digest.soak_digest({"w": DTensor()})
    t = torch.arange(6.0).reshape(2, 3)
    sub = hashlib.sha1(f"T{t.dtype}{tuple(t.shape)}".encode() + t.numpy().tobytes()).hexdigest()
    assert digest.soak_digest({"w": {digest.SOAK_HASHED: sub}}) == digest.soak_digest({"w": t})


def test_lost_shards_recognises_the_products_refusal() -> None:
    assert lost_shards(LOST_SHARDS.format(ranks="1", why="no mirror"))
    assert not lost_shards("no dead worker to restart: every rank is alive (%dist_status shows them)")


def watch_after(ops: List[Any]) -> MirrorWatch:
    watch = MirrorWatch(Counter())
    for op in ops:
        if op == "fault":
            watch.fault()
        elif op == "end":
            watch.end_step({"model": "m1", "opt": "o1"})
        else:
            watch.op(op[0], op[1], op[2] if len(op) > 2 else "")
    return watch


def test_the_mirror_point_is_the_state_after_the_last_refresh_and_a_recovery_must_bring_it_back() -> None:
    watch = watch_after([("build", True), "end", ("train-report", False)])  # the failed cell stepped past it
    assert watch.point == {"model": "m1", "opt": "o1"} and not watch.clean
    watch.op("recover-rescale", True)
    assert "model, opt are not the state of the last mirror point" in watch.end_step({"model": "m2", "opt": "o2"})
    watch.op("recover-restart", True)
    assert watch.end_step({"model": "m2", "opt": "o2"}) is None  # (the point moved with the last recovery)
    assert watch.checks["sharded: recoveries from the mirrors compared with the mirror point"] == 2


def test_a_snapshot_mirrors_the_state_a_failed_cell_left_and_a_fault_after_it_recovers_to_that() -> None:
    watch = watch_after([("build", True), "end", ("interrupt-collective", False)])
    watch.end_step({"model": "m2", "opt": "o2"})  # the interrupted cell stepped: the mirrors stay at m1
    assert watch.point == {"model": "m1", "opt": "o1"}
    watch.op("checkpoint-async", True)  # between cells: every rank's mirror of m2, then the write runs on
    watch.fault()  # a rank killed during the write
    watch.op("recover-rescale", True)
    assert watch.end_step({"model": "m2", "opt": "o2"}) is None
    assert watch.checks["sharded: recoveries from the mirrors compared with the mirror point"] == 1


def test_a_refusal_for_lost_shards_is_expected_only_where_the_soak_cannot_vouch_for_the_mirrors() -> None:
    assert not watch_after([("build", True), "end", "fault"]).refusal_expected([1], 2)  # killed between cells
    assert watch_after([("build", True), "end", ("kill-during-cell", False), "fault"]).refusal_expected([1], 2)
    assert watch_after([("build", True), "end"]).refusal_expected([0, 1], 3)  # a rank and its buddy
    faulted = watch_after([("build", True), "end", "fault", ("checkpoint", True), "end"])  # the refresh met the fault
    assert faulted.point is None and faulted.refusal_expected([1], 2)
    refused = watch_after([("build", True), "end", ("restart", False, "no dead worker to restart: ...")])
    assert refused.clean and not refused.refusal_expected([1], 2)  # a refusal touches nothing


def test_the_fsdp2_style_shards_its_model_and_every_rank_joins_the_gathers_before_a_report() -> None:
    style = programs.STYLES["fsdp2"]
    assert style.sharded and "parallel_strategy='fsdp2'" in programs.build_code(style, 8)
    cell = programs.training(style, 2, "ckpt", "e1c1")
    compile(cell, "<cell>", "exec")
    assert "soak_note('ckpt', 'e1c1', step, globals(), gather=True, write=train.get_context()" in cell
    assert "_st = soak_state(globals(), gather=True)" in cell.split("if train.get_context()")[0]
    plain = programs.training(programs.STYLES["fn"], 2, "report", "e1c2")
    assert "_dg = soak_note('report', 'e1c2', step, globals()) if train.get_context().get_world_rank() == 0 " \
           "else None\n" in plain and "gather" not in plain
