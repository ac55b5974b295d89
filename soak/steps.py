"""What each step of the catalog (:mod:`soak.plan`) does, through the current driver.

Each function takes the :class:`~soak.runner.Runner` and the token's arguments, runs its operation
(with a fault or an interrupt fired from this thread while it runs, for some), records the outcome
and the fault, and adds what the ledger must expect. The checks after the step are the runner's.
"""
from __future__ import annotations

import time
from typing import Any, Callable, Dict, List

from . import programs
from .faults import Fired, fault_action, fire
from .runner import DEADLINES, Runner


def _training(rn: Runner, mode: str, steps: int) -> None:
    tag = rn.tag()
    out, _ = rn.d.cell(programs.training(rn.style, steps, mode, tag), DEADLINES["cell"])
    rn.record(f"train-{mode}", out)
    if out.ok and mode == "ckpt":
        names = rn.ledger.reported_of(tag)
        rn.stats.checks["reported checkpoints of a successful cell all committed"] += 1
        if len(names) != steps:
            rn.violate("lost checkpoint", f"cell {tag} succeeded with {steps} reports with a checkpoint on every "
                       f"rank, but {len(names)} were committed: {names}")


def step_build(rn: Runner, a: List[str]) -> None:
    rn.rebuild(int(a[0]))


def step_train(rn: Runner, a: List[str]) -> None:
    _training(rn, "none", int(a[0]))


def step_report(rn: Runner, a: List[str]) -> None:
    _training(rn, "report", int(a[0]))


def step_ckpt(rn: Runner, a: List[str]) -> None:
    _training(rn, "ckpt", int(a[0]))


def step_bg(rn: Runner, a: List[str]) -> None:
    """A background cell; after a delay, a snapshot (taken at the next report) or an interrupt; then wait."""
    steps, mid, delay = int(a[0]), a[1], float(a[2])
    tag = rn.tag()
    out = rn.record("bg-start", rn.d.bg_start(programs.training(rn.style, steps, "report", tag, sleep_s=0.15),
                                             DEADLINES["cell"]))
    if not out.ok:
        return
    time.sleep(delay)
    if mid == "snap":
        name = rn.snap_name()
        rn.ledger.expect_snapshot_in_cell(name, tag)
        rn.record("checkpoint-during-bg", rn.d.checkpoint(name, True, DEADLINES["checkpoint"])[0])
    elif mid == "intr":
        rn.record("interrupt-bg", rn.d.bg_interrupt(DEADLINES["interrupt"]))
    rn.record("bg-wait", rn.d.bg_wait(DEADLINES["bg"]))


def _snapshot(rn: Runner, blocking: bool) -> None:
    name = rn.snap_name()
    rn.ledger.expect_snapshot(name, rn.rank0_digests())
    out = rn.record("checkpoint" if blocking else "checkpoint-async",
                    rn.d.checkpoint(name, blocking, DEADLINES["checkpoint"])[0])
    if blocking:
        rn.timed("checkpoint", out)


def step_snap(rn: Runner, a: List[str]) -> None:
    _snapshot(rn, True)


def step_snap_async(rn: Runner, a: List[str]) -> None:
    _snapshot(rn, False)


def step_rollback(rn: Runner, a: List[str]) -> None:
    rn.ledger.check()
    names = [n for n, k in rn.ledger.committed.items() if k == "snapshot"]
    name = names[int(a[0]) % len(names)] if names else "latest"
    out = rn.record("rollback", rn.d.rollback(name, DEADLINES["rollback"]))
    rn.digests = None
    if out.ok and name != "latest":
        rn.check_rollback(name)


def step_rescale(rn: Runner, a: List[str]) -> None:
    rn.digests = None
    before = rn.d.size()
    n = rn.target(a[0])
    out = rn.record(f"rescale-{'up' if n > before else 'down' if n < before else 'same'}",
                    rn.d.rescale(n, DEADLINES["rescale"])[0])
    if n > before:
        rn.timed("rescale", out)


def step_restart(rn: Runner, a: List[str]) -> None:
    rn.record("restart", rn.d.restart(DEADLINES["restart"])[0])


def step_intr(rn: Runner, a: List[str]) -> None:
    rn.digests = None
    src = programs.training(rn.style, None, "none", rn.tag())
    out, _ = rn.d.cell(src, DEADLINES["cell"], rn.d.interrupt_action(), float(a[0]), programs.MARK_LOOP)
    rn.record("interrupt-loop", out, accept_unnamed=out.error_type == "KeyboardInterrupt")


def step_intr_coll(rn: Runner, a: List[str]) -> None:
    rn.digests = None
    src = programs.blocked_in_collective(rn.style, a[1])
    out, _ = rn.d.cell(src, DEADLINES["cell"], rn.d.interrupt_action(), float(a[0]), programs.MARK_COLLECTIVE)
    rn.record("interrupt-collective", out, accept_unnamed=out.error_type == "KeyboardInterrupt")


def step_rank_error(rn: Runner, a: List[str]) -> None:
    rn.digests = None
    rn.record("rank-error", rn.d.cell(programs.blocked_in_collective(rn.style, "raise"), DEADLINES["cell"])[0])


def step_kill_idle(rn: Runner, a: List[str]) -> None:
    pid = rn.victim(a[0], rn.d.known_pids())()
    if pid and fire("kill", pid):
        rn.fault(Fired("kill", pid, 0.0, True), "idle")
        time.sleep(1.0)


def _cell_fault(rn: Runner, kind: str, a: List[str], stop_s: float = 0.0) -> None:
    rn.digests = None
    src = programs.training(rn.style, 40, "report", rn.tag(), sleep_s=0.05)
    act = fault_action(kind, rn.victim(a[0], rn.d.known_pids()), stop_s, time.monotonic())
    out, fired = rn.d.cell(src, DEADLINES["cell"], act, float(a[1]), programs.MARK_LOOP)
    rn.fault(fired, "cell")
    rn.record(f"{kind}-during-cell", out)


def step_kill_cell(rn: Runner, a: List[str]) -> None:
    _cell_fault(rn, "kill", a)


def step_stop_cell(rn: Runner, a: List[str]) -> None:
    _cell_fault(rn, "stop", a, float(a[2]))


def step_kill_coll(rn: Runner, a: List[str]) -> None:
    """Kill a rank while the others wait in the backward's all_reduce; when the victim is not the last
    rank (the one that never reaches the collective), interrupt after 2 s, as a user would."""
    rn.digests = None
    pids = rn.d.known_pids()
    victim = rn.victim(a[0], pids)
    kill = fault_action("kill", victim, 0.0, time.monotonic())
    interrupt = rn.d.interrupt_action()

    def act(running: bool) -> Any:
        fired = kill(running)
        if fired is not None and pids and fired.pid != pids[-1]:
            time.sleep(2.0)
            interrupt(running)
        return fired

    out, fired = rn.d.cell(programs.blocked_in_collective(rn.style, "sleep"), DEADLINES["cell"], act, float(a[1]),
                           programs.MARK_COLLECTIVE)
    rn.fault(fired, "collective")
    rn.record("kill-in-collective", out, accept_unnamed=out.error_type == "KeyboardInterrupt")


def step_kill_bg(rn: Runner, a: List[str]) -> None:
    """SIGKILL or SIGSTOP a rank while a background cell trains, then wait for the cell."""
    rn.digests = None
    out = rn.record("bg-start", rn.d.bg_start(programs.training(rn.style, 30, "report", rn.tag(), sleep_s=0.1),
                                             DEADLINES["cell"]))
    if not out.ok:
        return
    time.sleep(float(a[1]))
    pid = rn.victim(a[0], rn.d.known_pids())()
    kind, stop_s = a[2], float(a[3])
    if pid and fire(kind, pid, stop_s):
        rn.fault(Fired(kind, pid, float(a[1]), True, stop_s if kind == "stop" else 0.0), "background")
    rn.record("bg-wait", rn.d.bg_wait(DEADLINES["bg"]))


def _ckpt_fault(rn: Runner, kind: str, a: List[str], stop_s: float = 0.0) -> None:
    name = rn.snap_name()
    rn.ledger.expect_snapshot(name, rn.rank0_digests())
    act = fault_action(kind, rn.victim(a[0], rn.d.known_pids()), stop_s, time.monotonic())
    delay = float(a[1]) * rn.durations["checkpoint"]
    out, fired = rn.d.checkpoint(name, True, DEADLINES["checkpoint"] + stop_s, act, delay)
    rn.fault(fired, "checkpoint-write")
    rn.record(f"{kind}-during-checkpoint", out)


def step_kill_ckpt(rn: Runner, a: List[str]) -> None:
    _ckpt_fault(rn, "kill", a)


def step_stop_ckpt(rn: Runner, a: List[str]) -> None:
    _ckpt_fault(rn, "stop", a, float(a[2]))


def step_kill_ackpt(rn: Runner, a: List[str]) -> None:
    """An --async snapshot returns; SIGKILL a rank while (or after) it is written in the background."""
    name = rn.snap_name()
    rn.ledger.expect_snapshot(name, rn.rank0_digests())
    pids = rn.d.known_pids()
    started = time.monotonic()
    out = rn.record("checkpoint-async", rn.d.checkpoint(name, False, DEADLINES["checkpoint"])[0])
    time.sleep(max(0.0, float(a[1]) * 1.5 * rn.durations["checkpoint"] - (time.monotonic() - started)))
    writing = out.ok and not rn.d.checkpoint_written()
    pid = rn.victim(a[0], pids)()
    if pid and fire("kill", pid):
        rn.fault(Fired("kill", pid, time.monotonic() - started, writing), "async-write")


def step_kill_rescale(rn: Runner, a: List[str]) -> None:
    _rescale_fault(rn, "kill", a[0], a[1], float(a[2]))


def step_stop_rescale(rn: Runner, a: List[str]) -> None:
    _rescale_fault(rn, "stop", a[0], a[1], float(a[2]), float(a[3]))


def _rescale_fault(rn: Runner, kind: str, direction: str, who: str, frac: float, stop_s: float = 0.0) -> None:
    rn.digests = None
    n = rn.target(direction)
    delay = frac * (rn.durations["rescale"] if n > rn.d.size() else 0.1)
    act = fault_action(kind, rn.victim(who, rn.d.known_pids()), stop_s, time.monotonic())
    out, fired = rn.d.rescale(n, DEADLINES["rescale"], act, delay)
    rn.fault(fired, "rescale")
    rn.record(f"{kind}-during-rescale", out)


def step_kill_restart(rn: Runner, a: List[str]) -> None:
    """SIGKILL a rank; once the group shows it dead, restart, and SIGKILL another (or the new one) meanwhile."""
    rn.digests = None
    pids = rn.d.known_pids()
    first = rn.victim(a[0], pids)()
    if not first or not fire("kill", first):
        return
    rn.fault(Fired("kill", first, 0.0, True), "idle")
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:  # until the group shows the rank dead
        st = rn.d.status(DEADLINES["query"])
        if not st.ok or any(s == "dead" for _, _, s in st.value):
            break
        time.sleep(0.3)
    survivors = [p for p in pids if p != first]
    act = fault_action("kill", rn.victim(a[1], survivors or pids), 0.0, time.monotonic())
    out, fired = rn.d.restart(DEADLINES["restart"], None, act, float(a[2]) * rn.durations["restart"])
    rn.fault(fired, "restart")
    rn.record("kill-during-restart", out)


STEPS: Dict[str, Callable[[Runner, List[str]], None]] = {
    name[len("step_"):]: fn for name, fn in globals().items() if name.startswith("step_")}
