"""Section 18: a no-op ``%%distributed`` cell as users run it, in a real Jupyter kernel with the dashboard shown.

``python bench/bench_kernel.py [--quick]``. A kernel started and driven by ``jupyter_client`` (what Jupyter
does) loads the extension, starts a 2-worker group with ``%%distributed --workers 2`` (which displays the
group's dashboard), then runs, interleaved round by round:

* ``%%distributed\\npass``: the no-op cell, timed by the client from the execute request to the cell's
  ``idle`` status;
* ``pass``: a plain cell, the kernel's and the client's own cost, timed the same way;
* a plain cell that times, inside the kernel, ``group.run("pass")`` (the group's cost, the dashboard's
  observers included) and the floor: a no-op method on the same ``Worker`` actors
  (``ray.get([s.actor.ping.remote() for s in group.slots])``).

Every iopub message that arrives while a cell runs is counted by type, whatever its parent: a widget update
from the dashboard's timer thread is a ``comm_msg`` too.

18a. the magic's own cost: no-op magic cell - plain cell - ``group.run`` (per round; median). Target < 2 ms.
18b. widget (``comm_msg``) messages in all the no-op cells (magic and ``group.run``). Target: none. A cell that runs
     over 100 ms (a load spike) is shown as running, by design: the figure says how many did.
18c. (diagnostic) the no-op magic cell over the plain cell plus the floor, per round: the median ratio and its
     95 % bootstrap interval.
18d. (diagnostic) the no-op magic cell's time and iopub messages, beside the plain cell, ``group.run`` and the floor.
18f. ``group.run("pass")`` in the kernel, dashboard shown, over the floor (a no-op method on the same ``Worker``
     actors), per round: the median ratio, with its 95 % bootstrap interval. Target < 1.5x.
18e. (diagnostic) 18a again after the dashboard is closed (half the rounds, same kernel): what the shown
     dashboard still costs a cell is the difference.
"""
from __future__ import annotations

import collections
import json
import os
import queue
import shutil
import sys
import tempfile
import time
from typing import Any, Dict, List, Tuple

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import Figure, fmt_stats, median_ci, section, stats  # noqa: E402

ROUNDS = 200
WARMUP = 20
START_S = 300.0  # starting the kernel's Ray instance and the group (minutes on a loaded machine)
CELL_S = 60.0
MAGIC = "%%distributed\npass"
PLAIN = "pass"
SETUP = """\
import json as _json, time as _time
import ray as _ray
import raytrain_nb as _rt
from raytrain_nb._internal.output import CollectSink as _Sink
_g = _rt.active_group()
_floor, _runs = [], []
_d, _deadline = _g.dashboard(), _time.monotonic() + 120
while not _d.renders:  # the dashboard draws its first (empty) plot once, at the start: not a cell's message
    assert _time.monotonic() < _deadline, "the dashboard drew no plot within 120 s"
    _time.sleep(0.05)
"""
TIMED = """\
_t0 = _time.perf_counter()
_ray.get([_s.actor.ping.remote() for _s in _g.slots])
_t1 = _time.perf_counter()
_g.run("pass", sink=_Sink())
_t2 = _time.perf_counter()
_floor.append(_t1 - _t0)
_runs.append(_t2 - _t1)
"""
WIDGET = "application/vnd.jupyter.widget-view+json"
SHOWN_S = 0.1  # a cell that runs this long shows as running on the dashboard (raytrain_nb.notebook.dashboard.sync)


class KernelClient:
    """One ipykernel started by ``jupyter_client``; runs cells and counts every iopub message on the way."""

    def __init__(self, folder: str, env: Dict[str, str]) -> None:
        from jupyter_client.manager import start_new_kernel

        self.km, self.kc = start_new_kernel(kernel_name="python3", startup_timeout=120, env=env, cwd=folder)

    def cell(self, code: str, timeout: float = CELL_S) -> Tuple[float, collections.Counter, Dict[str, Any]]:
        """Run ``code``; returns (seconds to its idle status, iopub messages by type, what the cell showed).

        Waits for the cell's ``idle`` status up to ``timeout`` (then raises, naming the cell).
        """
        counts: collections.Counter = collections.Counter()
        shown: Dict[str, Any] = {"stdout": "", "displays": [], "error": None}
        t0 = time.perf_counter()
        msg_id = self.kc.execute(code, store_history=True)
        deadline = t0 + timeout
        while True:
            left = deadline - time.perf_counter()
            if left <= 0:
                raise TimeoutError(f"the cell {code.splitlines()[0]!r} did not end within {timeout:g} s")
            try:
                msg = self.kc.get_iopub_msg(timeout=left)
            except queue.Empty:
                continue
            kind = msg["msg_type"]
            counts[kind] += 1
            if msg["parent_header"].get("msg_id") != msg_id:
                continue
            if kind == "stream" and msg["content"]["name"] == "stdout":
                shown["stdout"] += msg["content"]["text"]
            elif kind == "display_data":
                shown["displays"].append(msg["content"]["data"])
            elif kind == "error":
                shown["error"] = "\n".join(msg["content"]["traceback"])
            elif kind == "status" and msg["content"]["execution_state"] == "idle":
                return time.perf_counter() - t0, counts, shown

    def ok(self, code: str, timeout: float = CELL_S) -> Dict[str, Any]:
        """Run a cell that must succeed; what it showed."""
        _, _, shown = self.cell(code, timeout)
        if shown["error"]:
            raise RuntimeError(f"the cell {code.splitlines()[0]!r} failed:\n{shown['error']}")
        return shown

    def close(self) -> None:
        """Stop the group and Ray first (a kernel with Ray's children takes long to stop), then the kernel."""
        try:
            self.cell("import ray\nray.shutdown()", timeout=60)
        except Exception:  # noqa: BLE001 - the kernel may be gone: stop it anyway
            pass
        self.km.shutdown_kernel(now=False)
        self.kc.stop_channels()


def measure(kernel: KernelClient, rounds: int, warmup: int) -> Dict[str, Any]:
    """The interleaved rounds; times in seconds, iopub messages by cell kind."""
    times: Dict[str, List[float]] = {"magic": [], "plain": []}
    messages: Dict[str, collections.Counter] = {"magic": collections.Counter(), "plain": collections.Counter(),
                                                "timed": collections.Counter()}
    for i in range(warmup + rounds):
        for name, code in (("plain", PLAIN), ("magic", MAGIC), ("timed", TIMED)):
            took, counts, shown = kernel.cell(code)
            if shown["error"]:
                raise RuntimeError(f"{name} cell failed:\n{shown['error']}")
            if i >= warmup:
                messages[name].update(counts)
                if name in times:
                    times[name].append(took)
    inside = json.loads(kernel.ok(f"print(_json.dumps([_floor[{warmup}:], _runs[{warmup}:]]))")["stdout"])
    return {"times": times, "floor": inside[0], "runs": inside[1], "messages": messages, "rounds": rounds}


def figures(m: Dict[str, Any]) -> List[Figure]:
    """Figures 18a-18d from :func:`measure`'s result."""
    t, n = m["times"], m["rounds"]
    over = _overhead(m)
    ratio = [mg / (pl + fl) for mg, pl, fl in zip(t["magic"], t["plain"], m["floor"])]
    run_ratio = [run / fl for run, fl in zip(m["runs"], m["floor"])]
    rr_lo, rr_hi = median_ci(run_ratio)
    s = {"magic": stats(t["magic"]), "plain": stats(t["plain"]), "run": stats(m["runs"]),
         "floor": stats(m["floor"]), "over": stats(over), "ratio": stats(ratio)}
    o_lo, o_hi = median_ci(over)
    r_lo, r_hi = median_ci(ratio)
    msg = m["messages"]
    widget = msg["magic"]["comm_msg"] + msg["timed"]["comm_msg"]
    slow = sum(x > SHOWN_S for x in t["magic"]) + sum(x > SHOWN_S for x in m["runs"])
    per_magic = {k: v / n for k, v in sorted(msg["magic"].items())}
    per_plain = {k: v / n for k, v in sorted(msg["plain"].items())}
    print(f"  %%distributed no-op cell: {fmt_stats(s['magic'], 1e3, 'ms')}")
    print(f"  plain 'pass' cell:        {fmt_stats(s['plain'], 1e3, 'ms')}")
    print(f"  group.run('pass') in the kernel: {fmt_stats(s['run'], 1e3, 'ms')}")
    print(f"  floor, Worker.ping on every rank in the kernel: {fmt_stats(s['floor'], 1e3, 'ms')}")
    print(f"  magic - plain - group.run: {fmt_stats(s['over'], 1e3, 'ms')}; 95% CI of the median "
          f"{o_lo * 1e3:.2f}..{o_hi * 1e3:.2f} ms")
    print(f"  magic / (plain + floor): median {s['ratio']['median']:.2f}, 95% CI {r_lo:.2f}..{r_hi:.2f}")
    print(f"  group.run / floor: median {stats(run_ratio)['median']:.2f}, 95% CI {rr_lo:.2f}..{rr_hi:.2f}")
    print(f"  iopub messages per magic cell {per_magic}; per plain cell {per_plain}")
    print(f"  widget messages (comm_msg) in {2 * n} no-op group cells: {widget}; cells that ran over "
          f"{SHOWN_S * 1e3:.0f} ms (shown as running, by design): {slow}")
    ms = lambda key: s[key]["median"] * 1e3  # noqa: E731
    return [
        Figure("18a", "no-op %%distributed cost over plain cell + group.run, dashboard shown", ms("over"), "ms", "<",
               2.0, spread=f"CI {o_lo * 1e3:.2f}..{o_hi * 1e3:.2f} ms, IQR {s['over']['q1'] * 1e3:.2f}.."
               f"{s['over']['q3'] * 1e3:.2f}, n={n}",
               note=f"magic {ms('magic'):.1f} ms, plain {ms('plain'):.1f} ms, group.run {ms('run'):.1f} ms",
               detail={k: v for k, v in s.items()}),
        Figure("18b", "widget messages sent by no-op cells, dashboard shown", float(widget), "", "<", 1,
               spread=f"{2 * n} cells ({n} %%distributed, {n} group.run)",
               note=f"comm_msg per magic cell {msg['magic']['comm_msg'] / n:.2f}; {slow} cells ran over "
               f"{SHOWN_S * 1e3:.0f} ms (a load spike): such a cell shows as running, by design"),
        Figure("18c", "diagnostic: no-op magic cell / (plain cell + Worker.ping floor)", s["ratio"]["median"], "x",
               "info", 1.0, spread=f"95% CI of the median {r_lo:.2f}..{r_hi:.2f}, n={n}",
               note=f"floor {ms('floor'):.2f} ms", detail={"ratio": ratio}),
        Figure("18f", "group.run('pass') in a kernel, dashboard shown / Worker.ping floor (median)",
               stats(run_ratio)["median"], "x", "<", 1.5, spread=f"median {stats(run_ratio)['median']:.2f}, 95% CI {rr_lo:.2f}..{rr_hi:.2f}"
               f", n={n}", note=f"group.run {ms('run'):.2f} ms, floor {ms('floor'):.2f} ms",
               detail={"ratio": run_ratio}),
        Figure("18d", "diagnostic: no-op %%distributed cell in a kernel, dashboard shown", ms("magic"), "ms", "info",
               ms("plain") + ms("run") + 2.0, spread=f"IQR {s['magic']['q1'] * 1e3:.1f}..{s['magic']['q3'] * 1e3:.1f}",
               note=f"iopub messages per cell: magic {sum(per_magic.values()):.1f}, "
                    f"plain {sum(per_plain.values()):.1f}",
               detail={"per_magic": per_magic, "per_plain": per_plain}),
    ]


def _overhead(m: Dict[str, Any]) -> List[float]:
    """Per round: the no-op magic cell's time minus the plain cell's and ``group.run``'s."""
    return [mg - pl - run for mg, pl, run in zip(m["times"]["magic"], m["times"]["plain"], m["runs"])]


def closed_figure(shown: Dict[str, Any], closed: Dict[str, Any]) -> Figure:
    """Figure 18e: the magic's own cost with the dashboard closed, beside it shown."""
    with_dash, without = stats(_overhead(shown)), stats(_overhead(closed))
    lo, hi = median_ci(_overhead(closed))
    magic = {"shown": stats(shown["times"]["magic"]), "closed": stats(closed["times"]["magic"])}
    print(f"  dashboard closed: magic - plain - group.run {fmt_stats(without, 1e3, 'ms')}; magic cell "
          f"{fmt_stats(magic['closed'], 1e3, 'ms')} (shown: {magic['shown']['median'] * 1e3:.2f} ms)")
    return Figure("18e", "diagnostic: 18a with the dashboard closed", without["median"] * 1e3, "ms", "info", 2.0,
                  spread=f"CI {lo * 1e3:.2f}..{hi * 1e3:.2f} ms, n={closed['rounds']}",
                  note=f"shown {with_dash['median'] * 1e3:.2f} ms; magic cell closed "
                       f"{magic['closed']['median'] * 1e3:.1f} vs shown {magic['shown']['median'] * 1e3:.1f} ms",
                  detail=magic)


def run(quick: bool = False) -> List[Figure]:
    """Start a kernel and its group, measure, stop them."""
    rounds, warmup = (30, 5) if quick else (ROUNDS, WARMUP)
    section(f"18. no-op %%distributed cell in a jupyter_client kernel with the dashboard shown, {rounds} rounds")
    folder = tempfile.mkdtemp(prefix="rtnb-bench-kernel-")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}  # its own embedded Ray instance
    env.update(OMP_NUM_THREADS="1", IPYTHONDIR=os.path.join(folder, ".ipython"),
               RAYTRAIN_NB_NUM_CPUS=os.environ.get("RAYTRAIN_NB_NUM_CPUS", "4"))
    kernel = KernelClient(folder, env)
    try:
        kernel.ok("%load_ext raytrain_nb")
        started = kernel.ok("%%distributed --workers 2\npass", timeout=START_S)
        if not any(WIDGET in d for d in started["displays"]):
            raise RuntimeError("the first %%distributed cell showed no dashboard widget")
        kernel.ok(SETUP)
        shown = measure(kernel, rounds, warmup)
        kernel.ok("_d.close()\n_floor.clear()\n_runs.clear()")
        closed = measure(kernel, rounds // 2, warmup)
        return figures(shown) + [closed_figure(shown, closed)]
    finally:
        kernel.close()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> int:
    from common import run_standalone

    return run_standalone(run, __doc__, "kernel", "fewer rounds (a smoke run)")


if __name__ == "__main__":
    sys.exit(main())
