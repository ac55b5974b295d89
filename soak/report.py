"""Counting what the soak did (operations and faults by kind, outcomes, checks) and the final report."""
from __future__ import annotations

import collections
import dataclasses
import time
from typing import Dict, List, Optional


@dataclasses.dataclass
class Violation:
    """A broken promise of the library: a hang, an unnamed failure, a lost or damaged checkpoint,
    ranks that differ, a group that does not recover, or actors/placement groups left over."""

    step: int
    token: str
    kind: str
    detail: str


class Stats:
    """Counters for the summary, and the list of violations and notes."""

    def __init__(self) -> None:
        self.ops: Dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.faults: collections.Counter = collections.Counter()
        self.checks: collections.Counter = collections.Counter()
        self.violations: List[Violation] = []
        self.notes: collections.Counter = collections.Counter()
        self.errors: collections.Counter = collections.Counter()
        self.started = time.monotonic()
        self.steps = 0

    def op(self, name: str, label: str) -> None:
        """One operation ``name`` that came to ``label`` (ok, an error class, HUNG)."""
        self.ops[name][label] += 1

    def fault(self, kind: str, phase: str, during: bool) -> None:
        """A fault ``kind`` (kill/stop) fired in ``phase`` (idle, cell, collective, checkpoint-write, ...);
        ``during``: the operation was still running when it fired."""
        self.faults[(kind, phase if during else f"{phase} (after it ended)")] += 1

    def violate(self, step: int, token: str, kind: str, detail: str) -> Violation:
        v = Violation(step, token, kind, detail)
        self.violations.append(v)
        return v

    def note(self, text: str) -> None:
        self.notes[text] += 1

    # -- totals -------------------------------------------------------------------------------

    def total_ops(self) -> int:
        return sum(sum(c.values()) for c in self.ops.values())

    def total_faults(self) -> int:
        return sum(self.faults.values())

    def faults_during(self, phase: str) -> int:
        return sum(n for (kind, p), n in self.faults.items() if p == phase)

    def summary(self, seed: int, targets: Optional[Dict[str, int]] = None) -> str:
        """The final table: operations, faults, checks, violations."""
        lines = [f"=== soak summary (seed {seed}, {self.steps} steps, {time.monotonic() - self.started:.0f} s) ==="]
        lines.append(f"{'operation':<22}{'count':>7}  outcomes")
        for name in sorted(self.ops):
            c = self.ops[name]
            outcomes = ", ".join(f"{k} {v}" for k, v in c.most_common())
            lines.append(f"{name:<22}{sum(c.values()):>7}  {outcomes}")
        lines.append(f"{'TOTAL operations':<22}{self.total_ops():>7}")
        lines.append("")
        lines.append(f"{'fault':<8}{'phase':<36}{'count':>6}")
        for (kind, phase), n in sorted(self.faults.items()):
            lines.append(f"{kind:<8}{phase:<36}{n:>6}")
        lines.append(f"{'TOTAL faults':<44}{self.total_faults():>6}")
        lines.append(f"  during a checkpoint write: {self.faults_during('checkpoint-write') + self.faults_during('async-write')}"
                     f", during a rescale: {self.faults_during('rescale')}, during a restart: "
                     f"{self.faults_during('restart')}")
        lines.append("")
        lines.append("checks: " + ", ".join(f"{k} {v}" for k, v in sorted(self.checks.items())))
        if self.notes:
            lines.append("notes (documented behaviour seen, not violations):")
            lines.extend(f"  {n}x {text}" for text, n in self.notes.most_common())
        if targets:
            got = {"operations": self.total_ops(), "faults": self.total_faults(),
                   "faults during a checkpoint write": self.faults_during("checkpoint-write")
                   + self.faults_during("async-write"),
                   "faults during a rescale": self.faults_during("rescale")}
            short = [f"{k} {got[k]} < {v}" for k, v in targets.items() if got.get(k, 0) < v]
            lines.append("targets: " + ("met" if not short else "NOT met: " + "; ".join(short)))
        lines.append("")
        kinds = collections.Counter(v.kind for v in self.violations)
        lines.append(f"VIOLATIONS: {len(self.violations)}" + (f" ({', '.join(f'{k} {n}' for k, n in kinds.items())})"
                                                             if kinds else ""))
        for v in self.violations:
            lines.append(f"  step {v.step} [{v.token}] {v.kind}: {v.detail.splitlines()[0][:300] if v.detail else ''}")
        return "\n".join(lines)
