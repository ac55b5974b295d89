"""Running the plan: episodes (one group each), every step under its deadline, and after every step the
checks: recover what failed with the documented command, every rank holds the same state, every
committed checkpoint still loads and holds what was saved; after every shutdown, nothing left in Ray.
"""
from __future__ import annotations

import os
import random
import time
from typing import Any, Dict, List, Optional

from . import faults, programs
from .ledger import Ledger, compare_ranks
from .report import Stats
from .shards import UNSETTLED, MirrorWatch, lost_shards
from .watchdog import Outcome, dump_stacks, excerpt

#: Deadlines of the operations, in seconds.
DEADLINES = {"start": 240, "cell": 90, "bg": 120, "checkpoint": 60, "rollback": 60, "restart": 150,
             "rescale": 150, "query": 60, "shutdown": 60, "interrupt": 30}


class Hung(Exception):
    """An operation ran past its deadline: the soak stops (its stacks were dumped)."""


class EpisodeOver(Exception):
    """The group cannot go on (every rank dead, or it did not recover): the next episode starts a new one."""


class Runner:
    """The soak's state between steps: the driver and group of the current episode, its ledger, counters.

    Args:
        args: the parsed command line (see :mod:`soak.chaos`).
        make_driver: ``make_driver("py"|"k")`` -> a driver.
        out_dir: where stack dumps and notes go.
    """

    def __init__(self, args: Any, make_driver: Any, out_dir: str) -> None:
        self.args = args
        self.make_driver = make_driver
        self.out_dir = out_dir
        self.stats = Stats()
        self.d: Any = None
        self.drivers: Dict[str, Any] = {}
        self.style = programs.STYLES["fn"]
        self.width = 16
        self.ledger: Optional[Ledger] = None
        self.episode = 0
        self.index = 0
        self.local = 0  # steps since the episode began (recovery choices are seeded with it)
        self.token = ""
        self.seq = 0
        self.digests: Optional[List[Dict[str, str]]] = None  # each rank's, as of the last check
        self.need_rebuild = False
        #: How long the last checkpoint / rescale up / restart took: fault delays are fractions of these.
        self.durations = {"checkpoint": 0.1, "rescale": 4.0, "restart": 5.0}
        self.seen: set = set()  # (episode, kind, detail) of violations already reported
        self.shards: Optional[MirrorWatch] = None  # a sharded style's mirrors, as the soak follows them
        self.snap_widths: Dict[str, int] = {}  # snapshot name -> the model's width when it was asked for

    # -- recording ---------------------------------------------------------------------------------

    def target(self, direction: str) -> int:
        """The size a rescale ``up``/``down``/``same`` goes to (up at 3 goes down, down at 1 goes up)."""
        from .plan import MAX_WORKERS

        size = self.d.size()
        if direction == "same":
            return size
        if direction == "up":
            return size + 1 if size < MAX_WORKERS else size - 1
        return size - 1 if size > 1 else size + 1

    def timed(self, what: str, out: Outcome) -> None:
        """Remember how long an undisturbed ``what`` took."""
        if out.ok:
            self.durations[what] = 0.5 * self.durations[what] + 0.5 * out.elapsed

    def violate(self, kind: str, detail: str) -> None:
        """A violation, reported once per episode (a divergence persists across steps)."""
        key = (self.episode, kind, detail)
        if key in self.seen:
            self.say(f"(still) {kind}: {detail[:200]}")
            return
        self.seen.add(key)
        self.stats.violate(self.index, self.token, kind, detail)
        self.say(f"VIOLATION {kind}: {detail[:1000]}")

    def say(self, text: str) -> None:
        print(f"    {text}", flush=True)

    def record(self, op: str, out: Outcome, accept_unnamed: bool = False) -> Outcome:
        """Count one operation. A failure that is not named is a violation; so is a call past its deadline,
        which stops the soak unless it returns within ``--grace`` seconds more."""
        if out.hung:
            self.say(f"{op}: {out.short()} ({out.elapsed:.1f} s)")
            out = self.hang(op, out)  # returns only when the call ended within the grace period
            self.stats.op(op, f"late {out.label}")
        else:
            self.stats.op(op, out.label)
        if not out.ok:
            self.stats.errors[(op, out.error_type)] += 1
        self.say(f"{op}: {out.short()} ({out.elapsed:.1f} s)")
        if not out.ok and not out.named and not accept_unnamed:
            self.violate("unnamed failure", f"{op}: {out.error_type}: {out.message}")
        if self.shards is not None:
            self.shards.op(op, out.ok, out.message)
        if not out.ok and "NameError" in out.message:
            self.need_rebuild = True  # a name made in a training cell is missing on a replacement rank
            self.stats.note("NameError after a replacement (state made in a training cell is not rebuilt)")
        return out

    def hang(self, op: str, out: Outcome) -> Outcome:
        """A call past its deadline: dump every stack, then (with ``--grace``) wait longer to tell a slow call
        from one that never returns. Only the latter stops the soak."""
        pids = [os.getpid(), self.d.driver_pid() if self.d else 0] + self.worker_pids()
        files = dump_stacks(pids, os.path.join(self.out_dir, "stacks"), f"step{self.index}")
        print(f"    {op} is past its deadline: {out.message}; stacks in {os.path.dirname(files[0]) if files else '-'}")
        for f in files:
            print(f"--- {f}\n{excerpt(f, 60)}")
        stacks = "".join(f"\n--- {f}\n{excerpt(f)}" for f in files)
        late = out.later(self.args.grace) if out.later is not None and self.args.grace > 0 else None
        if late is not None:
            self.violate("over deadline", f"{op} returned only after {late.elapsed:.0f} s "
                         f"(deadline {out.elapsed:g} s): {late.short()}{stacks}")
            return late
        more = f" (and {self.args.grace:g} s more)" if self.args.grace > 0 else ""
        self.violate("hang", out.message + more + stacks)
        raise Hung(out.message)

    def fault(self, fired: Any, phase: str) -> None:
        if fired is None:
            self.say("fault: the victim was already gone")
            return
        if self.shards is not None:
            self.shards.fault()
        self.stats.fault(fired.kind, phase, fired.during)
        extra = f" for {fired.stop_s:.1f} s" if fired.kind == "stop" else ""
        when = "between cells" if phase == "idle" else \
            f"at {fired.at:.2f} s, {phase} {'still running' if fired.during else 'already over'}"
        self.say(f"fault: {fired.kind} pid {fired.pid}{extra} {when}")

    # -- helpers for steps ------------------------------------------------------------------------

    def tag(self) -> str:
        self.seq += 1
        return f"e{self.episode}c{self.seq}"

    def snap_name(self) -> str:
        self.seq += 1
        name = f"soak-e{self.episode}-s{self.seq}"
        self.snap_widths[name] = self.width
        return name

    def worker_pids(self) -> List[int]:
        """Pids of every live worker actor in the cluster (Ray's actor table)."""
        try:
            from ray._private.state import state

            return [a.get("Pid", 0) for a in state.actor_table(None).values()
                    if a.get("State") == "ALIVE" and a.get("ActorClassName") == "Worker"]
        except Exception:  # noqa: BLE001
            return []

    def victim(self, spec: str, old: List[int]) -> Any:
        """A function giving the pid to hit: rank ``spec`` (mod the size) of ``old``, or ``new``: a worker
        started since (falls back to an old rank)."""

        def pick() -> Optional[int]:
            if spec == "new":
                fresh = [p for p in self.worker_pids() if p and p not in old]
                if fresh:
                    return random.Random(self.index).choice(fresh)
                spec_rank = len(old) - 1
            else:
                spec_rank = int(spec)
            return old[spec_rank % len(old)] if old else None

        return pick

    def rank0_digests(self) -> Optional[Dict[str, str]]:
        """Rank 0's digests now (from the last check when no cell ran since); None when unavailable."""
        if self.digests is None:
            out = self.record("digests", self.d.digests(DEADLINES["cell"]))
            self.digests = out.value if out.ok else None
        return dict(self.digests[0]) if self.digests else None

    # -- episodes ---------------------------------------------------------------------------------

    def begin_episode(self, driver: str, style: str, workers: int) -> None:
        """End the current group; start one driven by ``driver`` (py/k), run the setup cells of ``style``."""
        self.end_episode()
        self.episode += 1
        self.style, self.width = programs.STYLES[style], 16
        self.shards = MirrorWatch(self.stats.checks) if self.style.sharded else None
        if driver not in self.drivers:
            self.drivers[driver] = self.make_driver(driver)
        self.d = self.drivers[driver]
        run = f"soak-{self.args.seed}-e{self.episode}-{driver}-{style}"
        notes = os.path.join(self.out_dir, f"notes-e{self.episode}.jsonl")
        out = self.record("start", self.d.start(workers, run, DEADLINES["start"]))
        if not out.ok:
            self.d = None
            raise EpisodeOver(f"the group did not start: {out.short()}")
        self.ledger = Ledger(self.d.run_dir, notes)
        self.digests = None
        self.need_rebuild = False
        for source in (programs.prelude(self.args.ballast_mb), programs.helpers(notes), self.style.define):
            if source:
                self.record("setup", self.d.cell(source, DEADLINES["cell"])[0])
        self.rebuild()

    def rebuild(self, width: Optional[int] = None) -> Outcome:
        """(Re)build the style's model(s) under the same names."""
        self.width = width or self.width
        if self.style.trains_in_build:
            src = programs.training(self.style, 2, "report", self.tag(), build_width=self.width)
        else:
            src = programs.build_code(self.style, self.width)
        self.need_rebuild = False
        self.digests = None
        return self.record("build", self.d.cell(src, DEADLINES["cell"])[0])

    def end_episode(self) -> None:
        """Shut the group down, check that Ray holds nothing of it, re-verify every checkpoint of the run."""
        if self.d is None:
            return
        d, self.d = self.d, None
        if d.kind == "py" and getattr(d, "bg", None) is not None and not d.bg.done():
            d.bg_interrupt(DEADLINES["interrupt"])
            d.bg_wait(DEADLINES["bg"])
        self.record("shutdown", d.shutdown(DEADLINES["shutdown"]))
        faults.continue_all()
        self.check_leaks()
        if self.ledger is not None:
            self.report_ledger(self.ledger.check(reverify=True))
            self.stats.checks["checkpoint index re-read after shutdown"] += 1

    def check_leaks(self, wait_s: float = 20.0) -> None:
        """No actor or placement group of ours may outlive a shutdown (Ray's GCS; DEAD/REMOVED ones left out)."""
        import ray
        from ray._private.state import state

        deadline = time.monotonic() + wait_s
        while True:
            actors = [f"{a.get('ActorClassName')} pid {a.get('Pid')} {a.get('State')}"
                      for a in state.actor_table(None).values() if a.get("State") != "DEAD"]
            pgs = [f"{pid[:8]} {p.get('state')}" for pid, p in ray.util.placement_group_table().items()
                   if p.get("state") != "REMOVED"]
            if not actors and not pgs:
                self.stats.checks["leak checks"] += 1
                return
            if time.monotonic() > deadline:
                self.violate("leak", f"after shutdown: actors {actors}, placement groups {pgs}")
                return
            time.sleep(0.5)

    # -- after every step -----------------------------------------------------------------------------

    def after_step(self) -> None:
        """Continue stopped workers, recover a failed group, then compare the ranks and check the ledger."""
        faults.continue_all()
        for attempt in range(4):
            self.settle()
            if self.need_rebuild:
                self.rebuild()
                continue
            out = self.d.digests(DEADLINES["cell"])
            if out.ok:
                self.digests = out.value
                break
            self.digests = None
            self.record("digests", out)
            if self.shards is not None and UNSETTLED in out.message:  # do what the refusal says: rescale
                st = self.d.status(DEADLINES["query"])
                again, _ = self.d.rescale(len(st.value) if st.ok else 1, DEADLINES["rescale"])
                self.record("recover-rescale", again)
                continue
            if not out.named:
                if self.shards is not None:
                    self.shards.end_step(None)
                return  # not a dead rank (recorded as a violation): nothing to recover
        else:
            self.unrecoverable("the group is still not usable after four recoveries")
        self.compare()
        if self.shards is not None:
            problem = self.shards.end_step(self.digests[0] if self.digests else None)
            if problem:
                self.violate("not the mirror point", problem)
        if self.ledger is not None:
            self.report_ledger(self.ledger.check())

    def compare(self) -> None:
        differ, partial = compare_ranks(self.digests or [])
        self.stats.checks["rank-equality checks"] += 1
        if differ:
            why = sorted({d[p] for d in self.digests or [] for p in differ if d.get(p, "").startswith("!")})
            where = ", ".join(differ) + (f" ({'; '.join(why[:3])})" if why else "")
            contained = all("[" in p or "." in p for p in differ)
            kind = "ranks differ (state held in a container)" if contained else "ranks differ"
            self.violate(kind, f"state differs across ranks: {where}")
        if partial:
            self.stats.note(f"state present on some ranks only (made in a training cell): {', '.join(partial)}")
            self.say(f"note: present on some ranks only: {', '.join(partial)}")

    def report_ledger(self, problems: List[str]) -> None:
        self.stats.checks["checkpoint checks"] += 1
        for p in problems:
            kind = "lost checkpoint" if "lost" in p else "damaged checkpoint"
            self.violate(kind, p)

    def settle(self) -> None:
        """While a rank is dead or silent: the documented recovery (restart, or rescale to the live ranks)."""
        rng = random.Random(f"{self.local}:{self.token}")  # the same choice when the episode is replayed
        for attempt in range(3):
            st = self.d.status(DEADLINES["query"])
            if st.hung:
                self.record("status", st)
            if not st.ok:
                self.record("status", st)
                self.unrecoverable(f"status() failed: {st.short()}")
            rows = st.value
            gone = [r for r, _, s in rows if s in ("dead", "unresponsive")]
            if not gone:
                return
            live = len(rows) - len(gone)
            if live == 0:
                self.stats.note("every rank died: a new group is started (documented: nothing to copy from)")
                raise EpisodeOver("every rank is dead")
            self.digests = None
            snaps = [n for n, k in self.ledger.committed.items() if k == "snapshot"] if self.ledger else []
            if self.shards is not None:  # a snapshot of another width does not load into a sharded model's shards
                snaps = [n for n in snaps if self.snap_widths.get(n) == self.width]
            choice = rng.choice(["restart", "restart", "rescale"] + (["restart-from-snapshot"] if snaps else []))
            if self.args.recover != "random":
                choice = self.args.recover
            if choice.startswith("restart"):
                name = snaps[-1] if choice == "restart-from-snapshot" else None
                out, _ = self.d.restart(DEADLINES["restart"], name)
                self.record(f"recover-{choice}", out)
                self.timed("restart", out)
                if out.ok and name:
                    self.check_rollback(name)
            else:
                out, _ = self.d.rescale(rng.randint(live, len(rows)), DEADLINES["rescale"])
                self.record("recover-rescale", out)
            if not out.ok and self.shards is not None and lost_shards(out.message):
                self.recover_lost_shards(gone, len(rows), out.message)
            elif not out.ok:
                other, _ = self.d.rescale(rng.randint(live, len(rows)), DEADLINES["rescale"]) \
                    if choice.startswith("restart") else self.d.restart(DEADLINES["restart"])
                self.record("recover-" + ("rescale" if choice.startswith("restart") else "restart"), other)
                if not other.ok and self.shards is not None and lost_shards(other.message):
                    self.recover_lost_shards(gone, len(rows), other.message)
        st = self.d.status(DEADLINES["query"])
        if not st.ok or any(s in ("dead", "unresponsive") for _, _, s in st.value):
            self.unrecoverable(f"ranks still dead after three recoveries: {st.value if st.ok else st.short()}")

    def recover_lost_shards(self, gone: List[int], size: int, message: str) -> None:
        """A sharded group's recovery was refused in one line: a lost rank's shards are gone (with its buddy's
        mirror, or its live predecessor trained past the mirror its buddy kept). Check the refusal fits what the
        soak knows of the mirrors, then do what it says: restart from the newest snapshot of this model; with none,
        the episode ends (documented: nothing else holds those shards)."""
        self.stats.checks["sharded: recoveries refused for lost shards"] += 1
        if not self.shards.refusal_expected(gone, size):
            self.violate("sharded recovery refused", f"rank(s) {gone} of {size} died while every mirror was current "
                         f"(no rank trained since the last mirror point), yet: {message[:300]}")
        self.report_ledger(self.ledger.check())
        fits = [n for n, k in self.ledger.committed.items() if k == "snapshot" and self.snap_widths.get(n) == self.width]
        if not fits:
            self.stats.note("sharded: a lost rank's shards were gone and no snapshot of the model was committed: "
                            "a new group (documented)")
            raise EpisodeOver("the shards of a lost rank are gone and no snapshot of this model was committed")
        out, _ = self.d.restart(DEADLINES["restart"], fits[-1])
        self.record("recover-restart-from-snapshot", out)
        if out.ok:
            self.check_rollback(fits[-1])

    def check_rollback(self, name: str) -> None:
        """After a rollback (or a restart from a snapshot) to ``name``: every rank holds what it saved."""
        self.ledger.check()
        got = self.d.digests(DEADLINES["cell"])
        if not got.ok:
            self.record("digests", got)
            return
        problem = self.ledger.rollback_problem(name, got.value)
        self.stats.checks["rollbacks verified"] += 1
        if problem:
            self.violate("rollback mismatch", problem)

    def unrecoverable(self, why: str) -> None:
        self.violate("unrecoverable", why)
        raise EpisodeOver(why)
