"""Where every rank is now (``%dist_where``, the dashboard's Where button, a quiet cell's notice).

Every rank is asked at once through the fan-out (``timing.WHERE_S``). A rank answers with its cell thread's
stack (``worker/where.py``); ranks whose stacks are the same are grouped, the odd one out named first::

    rank 1: in time.sleep (cell 5, line 7); ranks 0, 2, 3: in all_reduce for 61 s (cell 5, line 4)

A rank whose control thread did not answer is reported as held by C code that keeps its GIL, with py-spy's
stack when ``py-spy`` is installed, the rank runs on this machine and the system lets it attach.
"""
from __future__ import annotations

import ast
import dataclasses
import logging
import shutil
import socket
import subprocess
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional, Tuple

from ..errors import first_line
from .fanout import FANOUT, Reply, ReplyKind
from .timing import PYSPY_S, WHERE_S

if TYPE_CHECKING:  # the core is handed in; never imported here at run time
    from .core import GroupCore

logger = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class RankWhere:
    """One rank: ``summary`` in one line, its ``stack`` (user frames first), and ``key`` to group equal ones."""

    rank: int
    summary: str
    stack: str = ""
    key: Tuple[Any, ...] = ()
    seconds: Optional[float] = None  # in a collective this long


@dataclasses.dataclass
class Whereabouts:
    """Every asked rank's :class:`RankWhere`, and how long the asking took (``seconds``)."""

    ranks: List[RankWhere]
    seconds: float = 0.0

    def groups(self) -> List[Tuple[List[int], RankWhere]]:
        """Ranks with the same stack together, the smallest group (the odd one out) first."""
        found: Dict[Tuple[Any, ...], List[RankWhere]] = {}
        for r in self.ranks:
            found.setdefault(r.key or (r.summary,), []).append(r)
        groups = [([r.rank for r in members], _merged(members)) for members in found.values()]
        return sorted(groups, key=lambda g: (len(g[0]), g[0]))

    def line(self) -> str:
        """Every group in one line: ``rank 1: in time.sleep (cell 5, line 7); ranks 0, 2: in all_reduce ...``."""
        return "; ".join(f"{_ranks(ranks)}: {where.summary}" for ranks, where in self.groups())

    def __str__(self) -> str:
        parts = []
        for ranks, where in self.groups():
            parts.append(f"{_ranks(ranks)}: {where.summary}")
            if where.stack:
                parts.append("\n".join("    " + ln for ln in where.stack.rstrip().splitlines()))
        return "\n".join(parts)

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        printer.text(str(self))


def _ranks(ranks: List[int]) -> str:
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(map(str, ranks))


def _merged(members: List[RankWhere]) -> RankWhere:
    """One group's entry: the summary with the shortest time in the collective (every member waited as long)."""
    timed = [m for m in members if m.seconds is not None]
    return min(timed, key=lambda m: m.seconds) if timed else members[0]  # type: ignore[arg-type, return-value]


def call_name(code: str) -> str:
    """The outermost call of a line of code (``time.sleep`` of ``time.sleep(10)``), or the line itself."""
    try:
        tree = ast.parse(code.strip())
    except SyntaxError:
        return code.strip()[:60]
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            try:
                return ast.unparse(node.func)[:60]
            except Exception:  # noqa: BLE001 - an odd expression: its text will do
                break
    return code.strip()[:60]


def _place(frame: Dict[str, Any]) -> str:
    file = frame["file"]
    if file.startswith("<cell-"):
        return f"cell {file[6:].rstrip('>')}, line {frame['line']}"
    return f"{file.rsplit('/', 1)[-1]}, line {frame['line']}"


def describe(rank: int, answer: Dict[str, Any]) -> RankWhere:
    """One rank's answer to ``Worker.where`` as a :class:`RankWhere`."""
    frames = answer.get("frames") or []
    if answer.get("call") is None:
        return RankWhere(rank, "idle (no cell running)", key=("idle",))
    if not frames:
        return RankWhere(rank, f"busy with {answer['call'].lstrip('_')}", key=("busy", answer["call"]))
    user = [f for f in frames if f["user"]] or frames
    inner, last = user[-1], frames[-1]
    stack = "".join(f"{_place(f)}, in {f['function']}: {f['code']}\n" for f in frames)
    key = tuple((f["file"], f["line"], f["function"]) for f in frames)
    coll = answer.get("collective")
    if answer.get("debugging"):
        return RankWhere(rank, f"at the debugger prompt ({_place(last)})", stack, ("pdb",) + key)
    if coll:
        return RankWhere(rank, f"in {coll['name']} for {coll['seconds']:.0f} s ({_place(inner)})", stack,
                         ("collective", coll["name"]) + key, coll["seconds"])
    call = call_name(inner["code"]) if inner is last or inner["user"] else inner["function"]
    if answer.get("ddp") and any(f["function"] == "backward" for f in frames):
        return RankWhere(rank, f"in {call}() (DDP gradient sync) ({_place(inner)})", stack, key)
    return RankWhere(rank, f"in {call} ({_place(inner)})", stack, key)


def pyspy_stack(pid: int) -> Optional[str]:
    """``py-spy dump`` of ``pid`` (a process on this machine), or None when it cannot be had."""
    exe = shutil.which("py-spy")
    if exe is None or not pid:
        return None
    try:
        done = subprocess.run([exe, "dump", "--pid", str(pid)], capture_output=True, text=True, timeout=PYSPY_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.debug("py-spy dump of %s failed: %s", pid, exc)
        return None
    return done.stdout if done.returncode == 0 and done.stdout.strip() else None


def _here(slot: Any) -> bool:
    """Whether ``slot``'s worker runs on this machine (py-spy can attach only here)."""
    ip = str(slot.info.get("node_ip", ""))
    if ip in ("127.0.0.1", "localhost"):
        return True
    try:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        return ip == ray.util.get_node_ip_address()
    except Exception:  # noqa: BLE001 - not connected: compare with this host's own address
        return ip == socket.gethostbyname(socket.gethostname())


def _of_reply(reply: Reply, slot: Any) -> RankWhere:
    if reply.ok:
        return describe(reply.rank, reply.value)
    if reply.kind is ReplyKind.LATE:
        spy = pyspy_stack(int(slot.info.get("pid") or 0)) if _here(slot) else None
        why = (f"not answering within {WHERE_S:g} s: C code holds its GIL (or the process is stopped)"
               + ("" if spy else "; install py-spy to see its stack"))
        return RankWhere(reply.rank, why, spy or "", key=("late", reply.rank))
    if reply.kind is ReplyKind.RAISED:
        return RankWhere(reply.rank, f"cannot tell: {first_line(reply.error)}", key=("raised", reply.rank))
    return RankWhere(reply.rank, f"{reply.kind.value}: {first_line(reply.error)}", key=(reply.kind.value,))


def where(core: "GroupCore") -> Whereabouts:
    """Ask every rank where its cell thread is, all at once under ``timing.WHERE_S``."""
    started = time.perf_counter()
    slots = list(core.slots)
    replies = FANOUT.ask(slots, lambda s: s.actor.where.remote(), WHERE_S, "every rank to say where it is")
    ranks = [_of_reply(reply, slots[i]) for i, reply in enumerate(replies)]
    return Whereabouts(ranks, time.perf_counter() - started)
