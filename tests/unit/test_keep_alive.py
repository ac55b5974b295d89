"""Keep-alive groups without Ray: durations, the custodian's ownership rules, the ``%dist_groups`` table."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading

import pytest

from raytrain_nb._internal.durations import format_duration, parse_duration
from raytrain_nb._internal.errors import ConfigError
from raytrain_nb._internal.group.custodian import EXIT_THREAD, Custodian
from raytrain_nb.notebook.magics_attach import format_groups

from ..waiting import wait_for


@pytest.mark.parametrize("text, seconds", [(None, 0.0), (0, 0.0), (90, 90.0), ("90", 90.0), ("90s", 90.0),
                                           ("30m", 1800.0), ("2h", 7200.0), ("1d", 86400.0), (" 1.5 H ", 5400.0)])
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["soon", "-5", "5 weeks", True, -1, float("inf")])
def test_a_bad_duration_is_refused_naming_it(bad):
    with pytest.raises(ConfigError, match=r"--keep-alive=.*(not a duration|0 or more)"):
        parse_duration(bad, "--keep-alive")


def test_durations_read_back():
    assert [format_duration(s) for s in (45, 600, 9000, 259200)] == ["45 s", "10 min", "2.5 h", "3.0 d"]


def _owner(n):
    return {"token": f"t{n}", "pid": 100 + n, "host": "box"}


@pytest.fixture
def custodian(tmp_path):
    """A Custodian in this process, its clock stopped after the test (its keep-alive would otherwise run out in
    the background and end the group it keeps)."""
    made = []

    def make(run, keep_alive_s, owner):
        made.append(Custodian(run, str(tmp_path), keep_alive_s, owner))
        return made[-1]

    yield make
    for keeper in made:
        keeper.stop_watching()


def test_a_live_owner_is_not_taken_over_silently(tmp_path, custodian):
    keeper = custodian("run-a", 60.0, _owner(1))
    assert keeper.beat("t1", busy=False) == ""
    refused = keeper.claim(_owner(2), steal=False)["refused"]
    assert "kernel pid 101 on box" in refused and "--steal" in refused
    got = keeper.claim(_owner(2), steal=True)
    assert got["stolen_from"] == "kernel pid 101 on box" and got["keep_alive_s"] == 60.0
    told = keeper.beat("t1", busy=False)  # the old owner's next word: taken, by whom
    assert "taken over by kernel pid 102 on box" in told and "--steal" in told
    assert keeper.beat("t2", busy=True) == ""
    assert "attached by kernel pid 102 on box (stolen)" in (tmp_path / "events.log").read_text()


@pytest.mark.parametrize("reaped", [True, False], ids=["gone", "zombie"])
def test_an_owner_of_this_machine_that_ended_is_taken_over_at_once(custodian, reaped):
    # a killed kernel beat a moment ago: its successor attaches without waiting out the silence, and without --steal
    ended = subprocess.Popen([sys.executable, "-c", "pass"])
    if reaped:
        ended.wait()
    else:
        wait_for(lambda: open(f"/proc/{ended.pid}/stat").read().rsplit(")", 1)[1].split()[0] == "Z", 30,
                 "the child to end unreaped")
    try:
        keeper = custodian("run-c", 60.0, {"token": "t1", "pid": ended.pid, "host": socket.gethostname()})
        assert keeper.beat("t1", busy=False) == ""
        assert not keeper.describe()["owner_alive"]
        got = keeper.claim(_owner(2), steal=False)
        assert "refused" not in got and got["stolen_from"] == "", got
    finally:
        ended.wait()
    alive = custodian("run-d", 60.0, {"token": "t3", "pid": os.getpid(), "host": socket.gethostname()})
    assert "refused" in alive.claim(_owner(4), steal=False)  # this process runs: still refused


def test_a_detached_group_is_claimed_and_counts_its_keep_alive(custodian):
    keeper = custodian("run-b", 60.0, _owner(1))
    assert keeper.update("t1", 1, ["w0", "w1"], ["pg"], b"state")
    assert not keeper.update("t1", 1, ["old"], [], b"older")  # an update that arrives late is ignored
    assert keeper.detach("t1", 30.0) == 30.0
    row = keeper.describe()
    assert row["size"] == 2 and not row["owner_alive"] and 29 < row["keep_alive_left_s"] <= 30
    got = keeper.claim(_owner(2), steal=False)
    assert got["workers"] == ["w0", "w1"] and got["state"] == b"state" and got["stolen_from"] == ""
    assert keeper.describe()["keep_alive_left_s"] is None  # attached: no clock runs


def test_the_groups_table():
    rows = [{"run": "run-a", "size": 2, "owner": "kernel pid 7 on box", "owner_alive": False, "age_s": 600.0,
             "idle_s": 30.0, "keep_alive_s": 1800.0, "keep_alive_left_s": 1500.0},
            {"run": "run-b", "size": 4, "owner": "kernel pid 8 on box", "owner_alive": True, "age_s": 50.0,
             "idle_s": None, "keep_alive_s": 60.0, "keep_alive_left_s": None}]
    table = format_groups(rows).splitlines()
    assert table[0].split()[:6] == ["run", "size", "owner", "age", "idle", "keep-alive"]
    assert "run-a" in table[1] and "(gone)" in table[1] and "10 min" in table[1] and "25 min (of 30 min)" in table[1]
    assert "(alive)" in table[2] and "running" in table[2] and "while attached" in table[2]
    assert format_groups([]) == "no keep-alive group is alive here"


def test_a_keep_alive_that_runs_out_ends_an_actors_process_only(tmp_path, custodian):
    """Its end takes the actor's process down with it; a Custodian in any other process (this test's) must not."""
    keeper = custodian("run-c", 0.2, _owner(1))
    keeper.detach("t1", 0.2)
    log = tmp_path / "events.log"
    wait_for(lambda: log.exists() and "keep-alive of 0.2 s ran out" in log.read_text(), 10.0,
             "the custodian's clock to end the group")
    wait_for(lambda: not any(t.name == EXIT_THREAD for t in threading.enumerate()), 10.0,
             "the custodian's exit thread to return")  # it returned: this process (pytest's) goes on
    assert keeper.claim(_owner(2), steal=False) == {"refused": "group run-c has ended"}  # ended, process alive
