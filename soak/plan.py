"""The step catalog and the seeded plan: which step comes next, with every random choice written into
its token (``kill_ckpt:1:0.12``), so a printed list of tokens replays the same sequence.

An episode token (``ep:py:gan:2``) starts a new group: driven from Python (``py``) or through a
kernel's magics (``k``), with a setup style and a size. Whatever happens at run time (faults land
differently, the group is smaller than a token's rank) is resolved when the step runs: a rank
argument is taken modulo the group's size.
"""
from __future__ import annotations

import dataclasses
import random
from typing import Callable, Dict, Iterator, List, Optional, Sequence

from .programs import DEFAULT_STYLES

MAX_WORKERS = 3


@dataclasses.dataclass(frozen=True)
class Kind:
    """One kind of step: its default weight, whether it fires a fault, what it does, its arguments."""

    name: str
    weight: float
    fault: bool
    doc: str
    args: Callable[[random.Random], List[str]]


def _r(rng: random.Random) -> str:
    return str(rng.randrange(MAX_WORKERS))


def _f(lo: float, hi: float) -> Callable[[random.Random], str]:
    return lambda rng: f"{rng.uniform(lo, hi):.2f}"


def _dir(up: float) -> Callable[[random.Random], str]:
    """A rescale direction, resolved against the group's size when the step runs."""
    return lambda rng: "up" if rng.random() < up else "down"


def _stop_s(rng: random.Random) -> str:
    """Mostly short stops (the worker comes back), sometimes longer than the heartbeat timeout."""
    return f"{rng.uniform(0.3, 2.5):.2f}" if rng.random() < 0.6 else f"{rng.uniform(7.0, 9.0):.2f}"


CATALOG: Dict[str, Kind] = {k.name: k for k in (
    Kind("build", 3, False, "re-run the setup under the same names with a new width", lambda g: [str(g.choice([8, 16, 24]))]),
    Kind("train", 5, False, "training cell without report()", lambda g: [str(g.randint(2, 6))]),
    Kind("report", 5, False, "training cell with report(metrics) each step", lambda g: [str(g.randint(2, 6))]),
    Kind("ckpt", 5, False, "training cell with report(metrics, checkpoint=) each step (rank 0's files)",
         lambda g: [str(g.randint(1, 4))]),
    Kind("bg", 4, False, "background cell with reports; meanwhile nothing, a snapshot, or an interrupt",
         lambda g: [str(g.randint(10, 30)), g.choice(["none", "snap", "snap", "intr"]), _f(0.3, 2.0)(g)]),
    Kind("snap", 5, False, "snapshot between cells (%dist_checkpoint)", lambda g: []),
    Kind("snap_async", 3, False, "snapshot written in the background (%dist_checkpoint --async)", lambda g: []),
    Kind("rollback", 4, False, "roll back to one of the committed snapshots", lambda g: [str(g.randrange(100))]),
    Kind("rescale", 4, False, "rescale up or down (or to the same size)",
         lambda g: [g.choice(["up", "up", "down", "down", "same"])]),
    Kind("restart", 1, False, "restart with no dead rank (must be refused, named)", lambda g: []),
    Kind("intr", 3, False, "interrupt a training loop", lambda g: [_f(0.0, 1.0)(g)]),
    Kind("intr_coll", 3, False, "interrupt while ranks wait in the backward's all_reduce",
         lambda g: [_f(0.2, 1.0)(g), g.choice(["sleep", "spin"])]),
    Kind("rank_error", 3, False, "an error on one rank while the others wait in a collective", lambda g: []),
    Kind("kill_idle", 2, True, "SIGKILL a worker between cells", lambda g: [_r(g)]),
    Kind("kill_cell", 3, True, "SIGKILL a worker during a training cell", lambda g: [_r(g), _f(0.0, 1.0)(g)]),
    Kind("stop_cell", 2, True, "SIGSTOP a worker during a training cell, SIGCONT later",
         lambda g: [_r(g), _f(0.0, 1.0)(g), _stop_s(g)]),
    Kind("kill_coll", 2, True, "SIGKILL a worker while ranks wait in a collective", lambda g: [_r(g), _f(0.2, 1.0)(g)]),
    Kind("kill_bg", 2, True, "SIGKILL or SIGSTOP a worker during a background cell",
         lambda g: [_r(g), _f(0.5, 2.5)(g), g.choice(["kill", "kill", "stop"]), _stop_s(g)]),
    # Delays of faults during checkpoints, rescales and restarts are fractions of how long the last such
    # operation took (measured as the soak goes), so they land inside it on any machine.
    Kind("kill_ckpt", 4, True, "SIGKILL a worker during a snapshot write", lambda g: [_r(g), _f(0.0, 1.1)(g)]),
    Kind("kill_ackpt", 2, True, "SIGKILL a worker during an --async snapshot's background write",
         lambda g: [_r(g), _f(0.0, 1.1)(g)]),
    Kind("stop_ckpt", 2, True, "SIGSTOP a worker during a snapshot write, SIGCONT later",
         lambda g: [_r(g), _f(0.0, 1.1)(g), _stop_s(g)]),
    Kind("kill_rescale", 4, True, "SIGKILL a worker (an old rank or a new one) during a rescale",
         lambda g: [_dir(0.75)(g), g.choice(["new", _r(g)]), _f(0.0, 1.1)(g)]),
    Kind("stop_rescale", 1, True, "SIGSTOP a worker during a rescale, SIGCONT later",
         lambda g: [_dir(0.75)(g), _r(g), _f(0.0, 1.1)(g), _stop_s(g)]),
    Kind("kill_restart", 2, True, "SIGKILL a worker, then another (or the replacement) during the restart",
         lambda g: [_r(g), g.choice(["new", _r(g)]), _f(0.0, 1.1)(g)]),
)}


def parse(token: str) -> "tuple[str, List[str]]":
    """``"kill_ckpt:1:0.12"`` -> ``("kill_ckpt", ["1", "0.12"])``."""
    name, *args = token.strip().split(":")
    if name != "ep" and name not in CATALOG:
        raise ValueError(f"unknown step {name!r} in {token!r}: steps are ep, {', '.join(sorted(CATALOG))}")
    return name, args


def parse_weights(text: str) -> Dict[str, float]:
    """``"kill_rescale=0,bg=2"`` -> weights that override the catalog's."""
    out: Dict[str, float] = {}
    for part in filter(None, (p.strip() for p in (text or "").split(","))):
        name, _, value = part.partition("=")
        if name not in CATALOG:
            raise ValueError(f"--weights: unknown step {name!r}")
        out[name] = float(value)
    return out


class Planner:
    """The seeded sequence of step tokens (or a replayed one).

    Args:
        seed: the seed of every random choice.
        workers: the size each new group starts with.
        kernel_share: the share of steps driven through a kernel (whole episodes; the first episode
            goes to the kernel when the share is above 0).
        weights: step weights overriding the catalog's.
        styles: the setup styles to draw from.
        replay: tokens to replay instead (the plan ends with them).
    """

    def __init__(self, seed: int, workers: int, kernel_share: float, weights: Optional[Dict[str, float]] = None,
                 styles: Sequence[str] = DEFAULT_STYLES, replay: Optional[List[str]] = None,
                 episode_len: "tuple[int, int]" = (8, 16)) -> None:
        self.rng = random.Random(seed)
        self.workers = workers
        self.kernel_share = kernel_share
        self.styles = list(styles)
        self.episode_len = episode_len
        w = {k.name: k.weight for k in CATALOG.values()}
        w.update(weights or {})
        self.names = [n for n in w if w[n] > 0]
        self.weights = [w[n] for n in self.names]
        self.replay = list(replay) if replay is not None else None
        self.left = 0
        self.kernel_ops = 0
        self.ops = 0
        self.kernel = False

    def __iter__(self) -> Iterator[str]:
        if self.replay is not None:
            for token in self.replay:
                parse(token)
                yield token
            return
        while True:
            if self.left <= 0:
                self.kernel = self.kernel_share > 0 and self.kernel_ops <= self.kernel_share * self.ops
                self.left = self.rng.randint(*self.episode_len)
                yield f"ep:{'k' if self.kernel else 'py'}:{self.rng.choice(self.styles)}:{self.workers}"
                continue
            self.left -= 1
            self.ops += 1
            self.kernel_ops += self.kernel
            name = self.rng.choices(self.names, self.weights)[0]
            yield ":".join([name, *CATALOG[name].args(self.rng)])
