"""A rank's cell channel (worker/channel.py) and the driver's side of it (group/channels.py), without Ray: a real
loopback socket, a handler standing in for ``Worker.run_cell_packed``."""
from __future__ import annotations

import os
import socket
import threading

import pytest

from raytrain_nb._internal.group.channels import Channel, _connect, claimed, wait_calls
from raytrain_nb._internal.worker.channel import CELL, CellChannel, frame, read_frame

from ..waiting import wait_for


class Handler:
    """Echoes each request as its outcome; ``gate`` (when set) holds a call until released."""

    def __init__(self) -> None:
        self.calls = []
        self.gate = None
        self.started = threading.Event()

    def __call__(self, request):
        self.calls.append(request)
        self.started.set()
        if self.gate is not None:
            assert self.gate.wait(30), "the test never let the call go"
        if request == "fail":
            raise RuntimeError("broken on purpose")
        return ["outcome of", request]


@pytest.fixture
def served():
    handler = Handler()
    channel = CellChannel({CELL: handler, "rollback": _rollback})
    yield channel, handler
    if handler.gate is not None:
        handler.gate.set()


class Unpicklable(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


def _rollback(request):
    """Another method the channel takes: answers a value, or raises its own error."""
    if request == "missing":
        raise FileNotFoundError("no snapshot named missing")
    if request == "unpicklable":
        raise Unpicklable("holds a lock")
    return {"restored": [request]}


def _held(channel: CellChannel, handler: Handler, request):
    """A line and a call the handler holds until ``handler.gate`` is set (the call runs on the rank by then)."""
    handler.gate = threading.Event()
    line = _open(channel)
    call = line.send(request)
    assert handler.started.wait(10), "the rank should have started the call"
    return line, call


def _open(channel: CellChannel) -> Channel:
    info = channel.open()
    line = _connect(info["port"], info["token"], info["pid"])
    assert line is not None, "a good token should connect"
    return line


def test_a_cell_goes_over_and_its_outcome_comes_back(served):
    channel, handler = served
    line = _open(channel)
    assert line.pid == os.getpid()
    call = line.send(["print(1)", 7])
    assert wait_calls([call], 10) == [call]
    assert call.reply == [call.seq, True, ["outcome of", ["print(1)", 7]]]
    second = line.send(["x = 2", 8])
    assert wait_calls([second], 10) == [second] and second.reply[2] == ["outcome of", ["x = 2", 8]]
    assert handler.calls == [["print(1)", 7], ["x = 2", 8]]


def test_it_listens_on_loopback_only(served):
    channel, _ = served
    channel.open()
    assert channel._listener.getsockname()[0] == "127.0.0.1"


def test_a_wrong_token_is_closed_unanswered_and_runs_nothing(served):
    channel, handler = served
    info = channel.open()
    assert _connect(info["port"], "0" * 32, info["pid"]) is None
    raw = socket.create_connection(("127.0.0.1", info["port"]), timeout=10)
    raw.sendall(b"f" * 32 + frame([1, "would run"]))
    assert raw.recv(10) == b"", "the channel should close a connection with a wrong token"
    raw.close()
    assert handler.calls == []


def test_only_the_newest_token_is_good(served):
    channel, _ = served
    old = channel.open()
    new = channel.open()
    assert old["port"] == new["port"] and old["token"] != new["token"]
    assert _connect(old["port"], old["token"], old["pid"]) is None
    assert _connect(new["port"], new["token"], new["pid"]) is not None


def test_a_pid_other_than_the_rank_s_is_refused(served):
    channel, _ = served
    info = channel.open()
    assert _connect(info["port"], info["token"], info["pid"] + 1) is None


def test_a_driver_that_connects_again_takes_over_and_the_first_line_ends(served):
    channel, _ = served
    first = _open(channel)
    second = _open(channel)
    call = first.send(["late", 1])
    assert wait_calls([call], 10) == [call] and call.lost and first.broken
    ok = second.send(["on", 2])
    assert wait_calls([ok], 10) == [ok] and ok.reply[1] is True


def test_a_failure_outside_the_cell_comes_back_as_such(served):
    channel, _ = served
    line = _open(channel)
    call = line.send("fail")
    wait_calls([call], 10)
    assert call.reply[1] is False and "RuntimeError: broken on purpose" in call.reply[2]


def test_another_method_answers_its_value(served):
    channel, handler = served
    line = _open(channel)
    call = line.send("model", "rollback")
    assert wait_calls([call], 10) == [call]
    assert call.reply == [call.seq, True, {"restored": ["model"]}]
    assert handler.calls == [], "a method's request should not reach the cell's handler"


def test_another_method_s_error_comes_back_as_the_exception_itself(served):
    channel, _ = served
    line = _open(channel)
    call = line.send("missing", "rollback")
    wait_calls([call], 10)
    assert call.reply[1] is False and isinstance(call.reply[2], FileNotFoundError)
    assert "no snapshot named missing" in str(call.reply[2])


def test_a_method_the_rank_did_not_give_is_refused_and_runs_nothing(served):
    channel, handler = served
    line = _open(channel)
    call = line.send("anything", "shutdown")
    wait_calls([call], 10)
    assert call.reply[1] is False and "no method 'shutdown'" in call.reply[2]
    after = line.send(["x = 1", 3])  # the line stays good
    assert wait_calls([after], 10) == [after] and after.reply[1] is True
    assert handler.calls == [["x = 1", 3]]


def test_an_error_that_cannot_travel_comes_back_as_its_words(served):
    channel, _ = served
    line = _open(channel)
    call = line.send("unpicklable", "rollback")
    wait_calls([call], 10)
    assert call.reply[1] is False and isinstance(call.reply[2], RuntimeError)
    assert str(call.reply[2]) == "Unpicklable: holds a lock"


def test_a_line_in_use_is_not_claimed_twice(served):
    channel, _ = served
    lines = {0: _open(channel), 1: _open(CellChannel({CELL: Handler()}))}
    seen = []
    with claimed(lines) as held:
        assert held is lines
        thread = threading.Thread(target=lambda: seen.append(claimed(lines).__enter__()))
        thread.start()
        thread.join(10)
        assert seen == [None], "a second thread should get no line while one is held"
    with claimed(lines) as again:  # and every lock is let go at the end
        assert again is lines
    with claimed(None) as none:
        assert none is None


def test_a_channel_needs_the_cell_s_handler():
    with pytest.raises(ValueError, match="must include 'cell'"):
        CellChannel({"rollback": _rollback})


def test_a_large_outcome_arrives_whole(served):
    channel, handler = served
    line = _open(channel)
    big = "x" * (5 << 20)
    call = line.send(big)
    assert wait_calls([call], 30) == [call]
    assert call.reply[2] == ["outcome of", big]


def test_the_wait_ends_at_its_deadline_while_a_call_runs(served):
    channel, handler = served
    line, call = _held(channel, handler, ["slow", 1])
    assert wait_calls([call], 0.05) == [] and not call.done
    handler.gate.set()
    assert wait_calls([call], 10) == [call] and call.reply[1] is True


def test_a_reply_to_a_call_given_up_on_is_dropped(served):
    channel, handler = served
    line, given_up = _held(channel, handler, ["first", 1])
    wanted = line.send(["second", 2])
    handler.gate.set()
    assert wait_calls([wanted], 10) == [wanted]
    assert wanted.reply[2] == ["outcome of", ["second", 2]] and given_up.reply is None


def test_what_became_of_a_request_is_kept_by_its_number(served):
    channel, handler = served
    line, call = _held(channel, handler, ["held", 1])
    token = line.token
    assert channel.result(token, call.seq, 0.01) == {"state": "running"}
    assert channel.result(token, call.seq + 5, 0.01) == {"state": "running"}, \
        "a request may still be on its way while its connection is open"
    assert channel.result("f" * 32, call.seq, 0.01) == {"state": "unknown"}, "another connection's numbers differ"
    handler.gate.set()
    done = channel.result(token, call.seq, 10)
    assert done["state"] == "done" and done["reply"] == [call.seq, True, ["outcome of", ["held", 1]]]
    line.close()
    assert channel.result(token, call.seq + 5, 10) == {"state": "unknown"}, \
        "once its connection was read to the end, a request that did not come never will"


def test_a_reply_survives_its_driver_leaving(served):
    channel, handler = served
    line, call = _held(channel, handler, ["orphaned", 3])
    line.close()
    handler.gate.set()
    wait_for(lambda: channel.result(line.token, call.seq, 0.01)["state"] == "done", 10, "the worker to keep the reply")
    kept = channel.result(line.token, call.seq, 0.01)
    assert kept["reply"] == [call.seq, True, ["outcome of", ["orphaned", 3]]], kept


def test_a_request_sent_just_before_the_line_closed_is_not_called_lost(served):
    """The driver's end closing right after a send: the rank still reads and runs what was sent."""
    channel, handler = served
    line = _open(channel)
    call = line.send(["just in time", 4])
    line.close()
    answer = channel.result(line.token, call.seq, 10)
    assert answer["state"] == "done" and handler.calls == [["just in time", 4]]


def test_a_send_on_a_closed_line_is_lost_at_once(served):
    channel, _ = served
    line = _open(channel)
    line.close()
    call = line.send(["never", 1])
    assert call.lost and wait_calls([call], 10) == [call]


def test_frames_take_what_plain_pickle_cannot(served):
    a, b = socket.socketpair()
    try:
        a.sendall(frame([1, lambda: 42]))
        value = read_frame(b)
        assert value[0] == 1 and value[1]() == 42
    finally:
        a.close()
        b.close()


def test_a_listener_that_cannot_prove_the_token_is_not_a_rank():
    """Whatever else listens on the port (the rank's process gone, the port reused) is not sent a cell."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    heard = {}

    def impostor():
        conn, _ = listener.accept()
        heard["token"] = conn.recv(64)
        conn.sendall(b"0" * 64 + os.getpid().to_bytes(8, "big"))
        conn.close()

    thread = threading.Thread(target=impostor, daemon=True)
    thread.start()
    try:
        assert _connect(listener.getsockname()[1], "a" * 32, os.getpid()) is None
        thread.join(10)
        assert heard["token"] == b"a" * 32
    finally:
        listener.close()
