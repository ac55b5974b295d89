"""Which rank's error a failed collective step names (``steps.first_cause``): the cause, not a peer's lost link."""
from __future__ import annotations

from raytrain_nb._internal.group.fanout import ReplyKind
from raytrain_nb._internal.group.steps import first_cause

LOST = RuntimeError("Gloo connectFullMesh failed with [pair.cc:152] timed out connecting: SO_ERROR: "
                    "Connection refused, remote=[127.0.0.1]:31157")
CLOSED = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:16768")


def test_the_first_error_that_is_not_a_lost_peer_is_named():
    failed = [(3, ReplyKind.RAISED, LOST), (5, ReplyKind.RAISED, ValueError("bad shard")), (1, ReplyKind.RAISED, CLOSED)]
    assert first_cause(failed) == (1, " (rank(s) 1, 3 failed too, after it)")


def test_a_death_comes_before_any_error():
    failed = [(0, ReplyKind.RAISED, ValueError("bad shard")), (2, ReplyKind.DIED, RuntimeError("SIGKILL"))]
    assert first_cause(failed) == (1, " (rank(s) 0 failed too, after it)")


def test_only_lost_peers_name_the_first_and_say_so():
    failed = [(4, ReplyKind.RAISED, LOST), (6, ReplyKind.RAISED, CLOSED)]
    assert first_cause(failed) == (0, " (rank(s) 6 failed too, each losing a peer)")


def test_one_failure_is_named_alone():
    assert first_cause([(2, ReplyKind.RAISED, LOST)]) == (0, "")
