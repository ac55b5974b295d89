"""A large group at a glance, as plain data: states counted, the slowest and fastest ranks, the ranks always listed.

Beyond :data:`LARGE` ranks a row per rank is unreadable (and each row's updates are widget messages), so the
dashboard and the text form show one summary instead, plus rows only for the ranks that need a look (failed,
dead, unresponsive or slow: always listed) and for a range the user expands (``"8-15"``). Both views render
the :class:`Summary` made here, so its rules are tested without a front end.
"""
from __future__ import annotations

import dataclasses
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from .model import GONE, LARGE, RankView, n_workers

#: At most this many ranks are listed for being failed, dead or slow (the summary counts the rest).
LISTED_MAX = 16
#: At most this many ranks are expanded at once.
EXPAND_MAX = 32
#: How many of the slowest and of the fastest ranks the summary names.
EXTREMES = 3
#: The order states are counted in (any other state after these).
STATE_ORDER = ("running", "idle", "starting", "recovering", "failed", "unresponsive", "dead", "shut down")


def is_large(n: int) -> bool:
    """Whether a group of ``n`` ranks is shown as a summary."""
    return n > LARGE


def flagged(view: RankView) -> bool:
    """A rank listed whatever the user expanded: failed, dead, unresponsive or slow."""
    return view.state in GONE or view.state == "failed" or view.slow


def speed(view: RankView) -> Optional[float]:
    """Steps per second: the rate over recent reports, else the inverse of the step time, else None."""
    if view.rate is not None and view.rate > 0:
        return view.rate
    if view.step_time:
        return 1.0 / view.step_time
    return None


@dataclasses.dataclass(frozen=True)
class Summary:
    """What the summary line says about a group's ranks."""

    total: int
    counts: Tuple[Tuple[str, int], ...]  # (state, ranks), in STATE_ORDER
    slowest: Tuple[Tuple[int, float], ...]  # (rank, steps/s), slowest first
    fastest: Tuple[Tuple[int, float], ...]  # (rank, steps/s), fastest first
    listed: Tuple[int, ...]  # failed, dead, unresponsive and slow ranks (at most LISTED_MAX)
    unlisted: int  # such ranks beyond LISTED_MAX
    done: Optional[Tuple[int, int]]  # the fewest and the most steps done in this cell
    total_steps: Optional[int]

    def text(self) -> str:
        """One line: ``64 workers: 60 running, 3 idle, 1 dead · steps 40-52/100 · slowest 12 (3.1/s) ...``."""
        parts = [f"{n_workers(self.total)}: " + ", ".join(f"{n} {state}" for state, n in self.counts)]
        if self.done is not None:
            lo, hi = self.done
            span = f"{lo}" if lo == hi else f"{lo}-{hi}"
            parts.append(f"steps {span}" + (f"/{self.total_steps}" if self.total_steps else ""))
        if self.slowest:
            parts.append("slowest " + ", ".join(f"{r} ({_rate(v)})" for r, v in self.slowest))
            parts.append("fastest " + ", ".join(f"{r} ({_rate(v)})" for r, v in self.fastest))
        if self.listed:
            more = f" and {self.unlisted} more" if self.unlisted else ""
            parts.append("look at " + ", ".join(map(str, self.listed)) + more)
        return " · ".join(parts)


def _rate(steps_per_s: float) -> str:
    return f"{steps_per_s:,.0f}/s" if steps_per_s >= 100 else f"{steps_per_s:.3g}/s"


def summarize(views: Mapping[int, RankView], extremes: int = EXTREMES, listed_max: int = LISTED_MAX) -> Summary:
    """The summary of ``views`` (one per rank)."""
    counts: Dict[str, int] = {}
    for view in views.values():
        counts[view.state] = counts.get(view.state, 0) + 1
    order = [s for s in STATE_ORDER if s in counts] + sorted(s for s in counts if s not in STATE_ORDER)
    speeds = sorted((s, r) for r, v in views.items() if (s := speed(v)) is not None)
    k = min(extremes, len(speeds) // 2) if len(speeds) > 1 else len(speeds)
    slowest = tuple((r, s) for s, r in speeds[:k])
    fastest = tuple((r, s) for s, r in reversed(speeds[-k:])) if k else ()
    # failed and dead first (they need a decision), then slow ranks, each in rank order
    marked = sorted((r for r, v in views.items() if flagged(v)), key=lambda r: (not _broken(views[r]), r))
    reporting = [v for v in views.values() if v.reports or v.step is not None]
    done = (int(min(v.done for v in reporting)), int(max(v.done for v in reporting))) if reporting else None
    totals = {v.total for v in reporting if v.total}
    return Summary(total=len(views), counts=tuple((s, counts[s]) for s in order), slowest=slowest,
                   fastest=fastest, listed=tuple(marked[:listed_max]), unlisted=max(0, len(marked) - listed_max),
                   done=done, total_steps=totals.pop() if len(totals) == 1 else None)


def _broken(view: RankView) -> bool:
    return view.state in GONE or view.state == "failed"


def shown_ranks(views: Mapping[int, RankView], expanded: Sequence[int] = (), summary: Optional[Summary] = None
                ) -> List[int]:
    """The ranks that get a row: all of them in a small group; else those always listed and those expanded."""
    if not is_large(len(views)):
        return sorted(views)
    summary = summary or summarize(views)
    return sorted(set(summary.listed) | {r for r in expanded if r in views})


def parse_ranks(text: str, n: int, most: int = EXPAND_MAX) -> List[int]:
    """``"8-15"``, ``"3"``, ``"0-3, 10"`` as a list of ranks of a group of ``n``; ``""`` is none.

    Raises:
        ValueError: one line naming the value and the form to use.
    """
    ranks: List[int] = []
    for part in (p.strip() for p in text.replace(" ", "").split(",")):
        if not part:
            continue
        lo_text, sep, hi_text = part.partition("-")
        try:
            lo = int(lo_text)
            hi = int(hi_text) if sep else lo
        except ValueError:
            raise ValueError(f"ranks {text!r}: give ranks as 'FIRST-LAST' or numbers separated by commas, "
                             f"such as '8-15' or '0,3,10'") from None
        if lo > hi or lo < 0 or hi >= n:
            raise ValueError(f"ranks {text!r}: {part} is not a range within 0-{n - 1} (the group has "
                             f"{n_workers(n)})")
        ranks.extend(range(lo, hi + 1))
    ranks = sorted(set(ranks))
    if len(ranks) > most:
        raise ValueError(f"ranks {text!r}: {len(ranks)} ranks at once; expand at most {most} "
                         f"(such as '{ranks[0]}-{ranks[0] + most - 1}')")
    return ranks
