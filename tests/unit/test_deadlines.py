"""Every wait on the driver has a deadline: an AST scan of the driver-side modules for waits without one.

The driver must never hang on a dead or stopped worker: ``ray.get``, ``ray.wait``, ``Event.wait``,
``Condition.wait``, a placement group's ``wait``, ``Queue.get``, ``Thread.join`` and ``Future.result``
all take a timeout there. ``_internal/worker/`` runs inside Ray actors and is not scanned.

The scan goes by method name, not by type: a wait that has no deadline by design (the user waiting for
their own cell, which may train for hours while its ranks are watched) says so where it is made, with
``# no deadline: <why>`` on its line or the line before.
"""
from __future__ import annotations

import ast
import logging
import pathlib
import sys
import threading
import time
import types
from collections import Counter
from typing import Iterator, List, Sequence, Tuple

import pytest

from raytrain_nb._internal import waits
from raytrain_nb._internal.errors import GroupError

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / "raytrain_nb"
#: Runs inside the Ray actors, not on the driver.
WORKER_SIDE = PACKAGE / "_internal" / "worker"
#: A call that waits without a deadline on purpose says why, on its line or the line before.
NO_DEADLINE = "# no deadline:"

#: Waits without a deadline that are known and owned by someone else right now, as
#: ``("raytrain_nb/<module>.py", "<call as the scan prints it>"): how many``. Temporary: an entry goes
#: when its module is fixed, and an entry the scan no longer finds fails the test.
ALLOWED = Counter({
    # group/formation.py and group/recovery.py are being changed by someone else; their waits get
    # deadlines there, not here. (When this list was written the scan found none in them.) Keep it empty.
})


def _kwargs(call: ast.Call) -> dict:
    return {kw.arg: kw.value for kw in call.keywords if kw.arg is not None}


def _is_none(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and node.value is None


def _has_timeout(call: ast.Call, names: Tuple[str, ...] = ("timeout",), positional: bool = True) -> bool:
    """Whether ``call`` passes a timeout that is not a literal ``None`` (by keyword, or as first argument)."""
    kwargs = _kwargs(call)
    if any(name in kwargs for name in names):
        return not any(_is_none(kwargs[name]) for name in names if name in kwargs)
    return positional and bool(call.args) and not _is_none(call.args[0])


def _says_why(lines: Sequence[str], lineno: int) -> bool:
    """Whether line ``lineno`` (1-based) or the one before carries ``# no deadline: <a reason>``."""
    for text in lines[max(lineno - 2, 0):lineno]:
        at = text.find(NO_DEADLINE)
        if at >= 0 and text[at + len(NO_DEADLINE):].strip():
            return True
    return False


def unbounded_waits(tree: ast.AST, lines: Sequence[str] = ()) -> Iterator[Tuple[int, str]]:
    """``(line, call)`` for every call in ``tree`` that may block with no deadline, in source order.

    ``lines`` (the source) lets a call marked ``# no deadline: <why>`` pass.
    """
    calls = sorted((n for n in ast.walk(tree) if isinstance(n, ast.Call)), key=lambda n: (n.lineno, n.col_offset))
    for node in calls:
        if not isinstance(node.func, ast.Attribute):
            continue
        name, owner = node.func.attr, node.func.value
        if isinstance(owner, ast.Name) and owner.id == "ray" and name in ("get", "wait"):
            bad = not _has_timeout(node, positional=False)  # keyword-only in Ray
        elif name == "wait":  # Event / Condition / placement group
            bad = not _has_timeout(node, ("timeout", "timeout_seconds"))
        elif name == "get":  # Queue.get (``block=False`` does not wait); dict.get always has a key
            block = _kwargs(node).get("block")
            nowait = isinstance(block, ast.Constant) and block.value is False
            bad = not node.args and not nowait and not _has_timeout(node)
        elif name in ("join", "result"):  # Thread.join / Future.result; str.join always has an argument
            bad = not _has_timeout(node)
        else:
            continue
        if bad and not _says_why(lines, node.lineno):
            yield node.lineno, ast.unparse(node)


def _driver_modules() -> Iterator[pathlib.Path]:
    for path in sorted(PACKAGE.rglob("*.py")):
        if WORKER_SIDE not in path.parents:
            yield path


def _scan() -> List[Tuple[str, int, str]]:
    found = []
    for path in _driver_modules():
        rel = path.relative_to(REPO).as_posix()
        text = path.read_text()
        found += [(rel, line, call) for line, call in unbounded_waits(ast.parse(text, str(path)), text.split("\n"))]
    return found


def test_every_driver_wait_has_a_deadline():
    found = _scan()
    allowed = ALLOWED.copy()
    offenders = []
    for rel, line, call in found:
        if allowed[(rel, call)] > 0:
            allowed[(rel, call)] -= 1
        else:
            offenders.append(f"{rel}:{line}: {call}")
    assert not offenders, (
        "waits without a deadline on the driver: pass timeout= (a constant of _internal/group/timing.py) and say "
        "what was waited for when it runs out (_internal/waits.py: get_within, wait_within, wait_until), or mark "
        "a wait for the user's own code '# no deadline: <why>':\n" + "\n".join(offenders))
    stale = [f"{rel}: {call}" for (rel, call), left in allowed.items() for _ in range(left)]
    assert not stale, "ALLOWED lists waits that are gone (remove them from the list):\n" + "\n".join(stale)


def test_the_scan_sees_the_driver_and_not_the_worker():
    scanned = {p.relative_to(PACKAGE).as_posix() for p in _driver_modules()}
    assert "_internal/group/execution.py" in scanned and "notebook/magics.py" in scanned
    assert not any(p.startswith("_internal/worker/") for p in scanned)


BAD = """
ray.get(refs)
ray.get(refs, timeout=None)
ray.get(refs, 5)
ray.wait(refs, num_returns=2)
event.wait()
event.wait(None)
cond.wait(timeout=None)
pg.wait()
ray.get(pg.ready())
queue.get()
queue.get(block=True)
thread.join()
thread.join(timeout=None)
future.result()
"""

GOOD = """
ray.get(refs, timeout=5)
ray.get(pg.ready(), timeout=CONTROL_CALL_S)
ray.wait(refs, num_returns=2, timeout=deadline)
event.wait(1.0)
event.wait(timeout=t)
pg.wait(timeout_seconds=10)
queue.get(timeout=1)
queue.get(block=False)
queue.get_nowait()
d.get("key")
d.get(key, None)
thread.join(2)
thread.join(timeout=2)
", ".join(parts)
future.result(timeout=3)
future.result(3)
bg.wait()  # no deadline: the user's own cell
# no deadline: the user's own cell, as long as it runs
bg.wait()
"""


def test_the_scan_can_fail():
    bad = list(unbounded_waits(ast.parse(BAD)))
    assert [call for _, call in bad] == [line for line in BAD.strip().splitlines()], bad
    assert [line for line, _ in bad] == list(range(2, 2 + len(bad)))
    assert list(unbounded_waits(ast.parse(GOOD), GOOD.split("\n"))) == []


def test_no_deadline_needs_a_reason_on_the_call():
    source = "bg.wait()  # no deadline:\n# no deadline: why\n\nbg.wait()\n"
    assert list(unbounded_waits(ast.parse(source), source.split("\n"))) == [(1, "bg.wait()"), (4, "bg.wait()")]


# -- the helpers of _internal/waits.py -------------------------------------------------------------


class _FakeRay(types.ModuleType):
    """Just enough of ``ray`` for the helpers: refs are strings, those in ``answered`` are ready."""

    def __init__(self, answered: Sequence[str]) -> None:
        super().__init__("ray")
        self.answered = set(answered)
        self.waits: List[float] = []

    def wait(self, refs, *, num_returns, timeout):
        self.waits.append(timeout)
        time.sleep(min(timeout, 0.01))
        return [r for r in refs if r in self.answered], [r for r in refs if r not in self.answered]

    def get(self, refs, *, timeout):
        return [f"value of {r}" for r in refs]


def test_wait_until_returns_when_done_and_gives_up_at_the_deadline():
    done = threading.Event()
    done.set()
    assert waits.wait_until(done.wait, 0, "a set event")
    assert not waits.wait_until(threading.Event().wait, 0.05, "an event nobody sets")
    thread = threading.Thread(target=time.sleep, args=(0.05,))
    thread.start()
    assert waits.join_within(thread, 5, "a short thread") and not thread.is_alive()


def test_a_long_wait_says_what_it_waits_for(monkeypatch, caplog):
    monkeypatch.setattr(waits, "SAY_AFTER_S", 0.02)
    log = logging.getLogger("raytrain_nb.test")
    with caplog.at_level(logging.INFO, logger="raytrain_nb.test"):
        assert not waits.wait_until(threading.Event().wait, 0.1, "rank 1 to answer", log)
    said = [r.getMessage() for r in caplog.records if r.name == "raytrain_nb.test"]
    assert said and all(m.startswith("waiting for rank 1 to answer (") and m.endswith("deadline 0.1 s)") for m in said)
    assert 1 <= len(said) <= 3  # at 0.02, 0.04, 0.08 s: doubling, not every slice


def test_get_within_waits_for_all_at_once_and_names_who_did_not_answer(monkeypatch):
    fake = _FakeRay(answered=["a", "c"])
    monkeypatch.setitem(sys.modules, "ray", fake)
    assert waits.wait_within(["a", "b", "c"], 0.05, "three ranks") == (["a", "c"], ["b"])
    with pytest.raises(GroupError) as info:
        waits.get_within(["a", "b", "c"], 0.05, "every rank to answer", labels=["rank 0", "rank 1", "rank 2"],
                         hint="see %dist_status")
    assert str(info.value) == ("gave up waiting for every rank to answer after 0.05 s (no answer from rank 1): "
                               "see %dist_status")
    fake.answered.add("b")
    assert waits.get_within(["a", "b"], 5, "two ranks") == ["value of a", "value of b"]
    assert all(t <= 5 for t in fake.waits)


#: Where ``group/`` waits on Ray other than through the fan-out, and why each is not "ask every rank".
NAMED_WAITS = {
    "fanout.py": "the fan-out itself: every rank asked at once, one deadline",
    "dispatch.py": "the wait on the user's cell, which may train for hours while its ranks are watched",
    "steps.py": "the step watch of a collective: is every rank in it, or still starting",
    "monitor.py": "the monitor's zero-timeout polls of its watches and heartbeats",
    "placement.py": "placement groups being placed",
    "snapshots.py": "a snapshot's wait for the next report() on every rank, and its background write",
    "validations.py": "one Ray task, not the ranks: a checkpoint's validation, polled every 0.2 s under its timeout_s",
    "survival.py": "one actor, not the ranks: a keep-alive group's heartbeat to its custodian, its detach and end",
    "attach.py": "one actor per group, not the ranks: the custodian's claim and descriptions at an attach",
    "mirrors.py": "the mirrors of a sharded group's shards handed over into the object store, never fetched",
}
_WAIT_CALLS = {("ray", "get"), ("ray", "wait"), ("", "wait_within"), ("", "get_within")}


def _ray_waits(tree: ast.AST) -> List[str]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            fn = node.func
            key = ((fn.value.id if isinstance(fn.value, ast.Name) else "?"), fn.attr) \
                if isinstance(fn, ast.Attribute) else ("", getattr(fn, "id", ""))
            if key in _WAIT_CALLS:
                found.append(f"{node.lineno} {ast.unparse(node.func)}")
    return found


def test_the_group_waits_only_in_its_named_places():
    """Asking every rank goes through ``fanout.FANOUT`` / ``collect``; the other waits are named above."""
    found = []
    for path in sorted((PACKAGE / "_internal" / "group").glob("*.py")):
        if path.name not in NAMED_WAITS:
            found += [f"{path.name}:{hit}" for hit in _ray_waits(ast.parse(path.read_text()))]
    assert not found, "waits on Ray outside the named places (use FANOUT.ask or core.collect):\n" + "\n".join(found)


def test_the_named_wait_scan_can_fail():
    planted = ast.parse("ray.wait(refs, timeout=1)\nwait_within(refs, 1, 'x')\nsession.get('k')\n")
    assert _ray_waits(planted) == ["1 ray.wait", "2 wait_within"]
