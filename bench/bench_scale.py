"""Section 21: what each operation costs as the group grows, beside the floor Ray sets (``python bench/bench_scale.py``).

Groups of 1, 2, 4, 8 and 16 workers (fractional CPUs: 4 CPUs shared by the largest group), on one raylet (the
embedded instance) and spread over four (``ray.cluster_utils.Cluster``, four nodes of one CPU, ``SPREAD``). For each
size: the group's start, a no-op cell with the dashboard shown, a cell printing one line per rank, ``report()`` to
the driver, a snapshot and a rollback of a small model, ``pull(rank=None)`` (``%dist_pull --all``), ``where()``
(``%dist_where``), an interrupt of a running background cell, a restart of one killed rank, a rescale
N -> N/2 -> N, and the shutdown. Beside each, its floor in the same run: the same fan-out as bare calls to the N
actors (``Worker.ping`` on the group's own actors for the calls that only ask, called in turn with them; bare torch
actors beside the group (no CPUs of their own), called in turn with ours, that each save, load or return the same
model bytes for snapshot, rollback and pull; N bare torch actors started (each building the model and optimizer
``SETUP`` makes), pinged and formed into a process group for the start; a bare ``init_process_group`` at N for the
restart; for the rescale one at N/2, N/2 bare actors started and one at N; for the interrupt the ping and one at N,
since an interrupted cell forms the process group again; ``ray.kill`` of N bare
actors for the shutdown).

21a-k. Each operation's fitted slope over N (least squares of the medians), ours over the floor's. Target < 1.5x
       (the floor's slope is taken as at least 0.05 ms a rank, so a flat floor does not divide by noise).
21n. The no-op cell over its floor at every N (the speed issue's per-cell target). Target < 1.5x at the worst N.
21r. Restart of one rank at the largest N over (its cost at 2 plus the floor's growth from 2 to N). Target < 1.
The table and a plot of cost against N (ours and the floor, both layouts) go to ``bench/results/scale.{json,png}``.

``--quick`` runs sizes 1, 2, 4 on one raylet only; ``BENCH_SCALE_SIZES=1,2,4,8`` and ``BENCH_SCALE_LAYOUTS=one,four``
in the environment choose.
The machine is shared (2 cores): the load average is printed with every section; ratios hold better than
absolutes, and sizes above the core count measure contention as much as our own work.
"""
from __future__ import annotations

import json
import os
import signal
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

BENCH_DIR = os.path.dirname(os.path.abspath(__file__))
if BENCH_DIR not in sys.path:
    sys.path.insert(0, BENCH_DIR)

from common import RESULTS_DIR, Figure, loadavg, section, single_thread  # noqa: E402

SIZES = (1, 2, 4, 8, 16)
TOTAL_CPUS = 4.0
REPS = {"noop": 31, "print": 15, "report": 15, "where": 7, "snapshot": 5, "rollback": 5, "pull": 5, "interrupt": 3,
        "restart": 3}
SETUP = """
import torch, raytrain_nb as train
torch.manual_seed(0)
rank = train.get_context().get_world_rank()
model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
"""
OPS = ("start", "noop", "print", "report", "snapshot", "rollback", "pull", "where", "interrupt", "restart",
       "rescale", "shutdown")
LABELS = {"start": "group start", "noop": "no-op cell, dashboard shown", "print": "cell printing a line per rank",
          "report": "report() to the driver", "snapshot": "snapshot", "rollback": "rollback", "pull": "pull --all",
          "where": "where()", "interrupt": "interrupt", "restart": "restart of one rank",
          "rescale": "rescale N -> N/2 -> N", "shutdown": "shutdown"}
MIN_FLOOR_SLOPE = 0.05e-3


class BareRank:
    """A bare torch actor: the floor of what each rank of ours does (imports torch, holds the model and optimizer
    ``SETUP`` makes, saves, loads, forms)."""

    def __init__(self) -> None:
        import torch

        torch.set_num_threads(1)
        torch.manual_seed(0)
        self.model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
        # the optimizer SETUP makes: a process's first one imports torch._dynamo (~0.9 s of CPU here), which every
        # rank of ours pays at its start; without it the start's floor left out half a second a rank
        self.opt = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.dir = tempfile.mkdtemp(prefix="bare-rank-")

    def ping(self) -> int:
        return os.getpid()

    def blob(self) -> Any:
        return self.model

    def save(self) -> None:
        """What a snapshot holds of a rank: the model, its optimizer and the RNG state."""
        import torch

        torch.save({"model": self.model.state_dict(), "opt": self.opt.state_dict(), "rng": torch.get_rng_state()},
                   os.path.join(self.dir, "m.pt"))

    def load(self) -> None:
        """A rollback of :meth:`save`'s state into the same objects."""
        import torch

        state = torch.load(os.path.join(self.dir, "m.pt"), weights_only=True)
        self.model.load_state_dict(state["model"])
        self.opt.load_state_dict(state["opt"])
        torch.set_rng_state(state["rng"])

    def open_store(self, world: int) -> int:
        """On rank 0: the rendezvous server, listening before the others come, as a group of ours opens it
        (a client that comes before the server backs off for hundreds of ms: the floor jumped 0.1 -> 0.45 s at 8
        ranks between runs when its ranks raced their server). Returns its port."""
        import datetime

        from torch.distributed import TCPStore

        self.store = TCPStore("127.0.0.1", 0, world, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=120))
        return self.store.port

    def form(self, port: int, rank: int, world: int) -> None:
        import datetime

        import torch.distributed as dist
        from torch.distributed import TCPStore

        timeout = datetime.timedelta(seconds=120)
        store = self.store if rank == 0 else TCPStore("127.0.0.1", port, world, is_master=False, timeout=timeout)
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world, timeout=timeout)
        dist.barrier()
        dist.destroy_process_group()
        if rank == 0:
            self.store = None


def _median(fn: Callable[[], Any], reps: int) -> float:
    """The median seconds of ``reps`` calls of ``fn`` after one untimed call (first-use costs: the driver's torch
    import at its first pull, a run's first snapshot directory)."""
    fn()
    out = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t0)
    return statistics.median(out)


def _paired(floor: Callable[[], Any], ours: Callable[[], Any], reps: int) -> Tuple[float, float]:
    """The median seconds of ``floor`` and of ``ours``, called in turn (A B A B ...) ``reps`` times each after one
    untimed call of each: the machine's drift from second to second hits both alike."""
    floor()
    ours()
    a: List[float] = []
    b: List[float] = []
    for _ in range(reps):
        for fn, out in ((floor, a), (ours, b)):
            t0 = time.perf_counter()
            fn()
            out.append(time.perf_counter() - t0)
    return statistics.median(a), statistics.median(b)


def _slope(ns: Sequence[int], ys: Sequence[float]) -> float:
    """Least-squares slope of ``ys`` against ``ns`` (seconds a rank)."""
    if len(ns) < 2:
        return float("nan")
    mn, my = statistics.fmean(ns), statistics.fmean(ys)
    den = sum((n - mn) ** 2 for n in ns)
    return sum((n - mn) * (y - my) for n, y in zip(ns, ys)) / den if den else float("nan")


def _bare_floors(n: int, cpus: float, strategy: str) -> Dict[str, float]:
    """The floors that need bare actors of their own, after the group is gone: start, restart, rescale, shutdown.
    The actors take the places of a placement group of ``n`` bundles (``strategy``: PACK or SPREAD), as a group's
    ranks do."""
    import ray

    from ray.util.placement_group import placement_group, remove_placement_group
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    Bare = ray.remote(num_cpus=cpus)(BareRank)
    out: Dict[str, float] = {}
    t0 = time.perf_counter()  # N places reserved at once, as every gang-scheduled group of ranks is (ours too)
    pg = placement_group([{"CPU": cpus}] * n, strategy=strategy)
    ray.get(pg.ready(), timeout=600)

    def bare(i: int) -> Any:
        return Bare.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=i)).remote()

    actors = [bare(i) for i in range(n)]
    ray.get([a.ping.remote() for a in actors], timeout=600)
    out["start"] = time.perf_counter() - t0

    def form(world: int) -> None:
        port = ray.get(actors[0].open_store.remote(world), timeout=120)
        ray.get([a.form.remote(port, r, world) for r, a in enumerate(actors[:world])], timeout=300)

    t0 = time.perf_counter()
    form(n)  # gloo's first use in each process is paid once, as our group paid it at its start
    out["start"] += time.perf_counter() - t0  # a group's start forms its process group: so does its floor's
    out["restart"] = _median(lambda: form(n), 3)
    if n >= 2:  # a rescale N -> N/2 -> N: a process group at N/2, N/2 new actors started, a process group at N
        half = _median(lambda: form(max(1, n // 2)), 2)
        for a in actors[n // 2:]:  # their places go to the new ones (at 16 ranks the CPUs are all taken)
            ray.kill(a)
        t0 = time.perf_counter()
        actors[n // 2:] = [bare(i) for i in range(n // 2, n)]
        ray.get([a.ping.remote() for a in actors], timeout=600)
        spawn = time.perf_counter() - t0
        out["rescale"] = half + spawn + _median(lambda: form(n), 1)
    else:
        out["rescale"] = float("nan")
    t0 = time.perf_counter()  # the places released, then every actor killed: what a shutdown of ours does
    remove_placement_group(pg)
    for a in actors:
        ray.kill(a)
    out["shutdown"] = time.perf_counter() - t0
    return out


def _measure(n: int, layout: str, reps: Dict[str, int]) -> Dict[str, Dict[str, float]]:
    """``{op: {"ours": s, "floor": s}}`` for a group of ``n`` on the current Ray instance."""
    import ray

    from raytrain_nb import WorkerGroup
    from raytrain_nb._internal.output import CollectSink
    from raytrain_nb.notebook.dashboard.view import dashboard_for

    cpus = TOTAL_CPUS / max(SIZES)
    spread = "SPREAD" if layout == "four" else "PACK"
    res: Dict[str, Dict[str, float]] = {op: {} for op in OPS}
    sink = CollectSink()
    t0 = time.perf_counter()
    g = WorkerGroup(n, cpus_per_worker=cpus, placement_strategy=spread, heartbeat_timeout_s=300,
                    name=f"scale-{layout}-{n}-{int(time.time())}")
    g.run(SETUP, sink=sink)
    res["start"]["ours"] = time.perf_counter() - t0

    def ping() -> None:
        ray.get([s.actor.ping.remote() for s in g.slots], timeout=60)

    dash = dashboard_for(g)
    try:
        calls = {"noop": lambda: g.run("pass", sink=sink),
                 "print": lambda: g.run("print(f'rank {rank} says hello')", output="all", sink=sink),
                 "report": lambda: g.run("train.report({'loss': 1.0})", sink=sink), "where": g.where}
        for op, call in calls.items():  # each beside its floor, interleaved
            res[op]["floor"], res[op]["ours"] = _paired(ping, call, reps[op])
        # their floors: bare actors beside the group (no CPUs of their own: the group holds them all at 16), called
        # in turn with ours, as the cells are, so a second of load hits both alike
        beside = ray.remote(num_cpus=0)(BareRank)
        bare = [beside.options(scheduling_strategy="SPREAD").remote() for _ in range(n)]
        try:
            ray.get([a.ping.remote() for a in bare], timeout=600)
            for op, floor, ours in (
                    ("snapshot", lambda: ray.get([a.save.remote() for a in bare], timeout=120), g.checkpoint),
                    ("rollback", lambda: ray.get([a.load.remote() for a in bare], timeout=120), g.rollback),
                    ("pull", lambda: ray.get([a.blob.remote() for a in bare], timeout=120),
                     lambda: g.pull("model", rank=None))):
                res[op]["floor"], res[op]["ours"] = _paired(floor, ours, reps[op])
        finally:
            for a in bare:
                ray.kill(a)
        times = []
        for _ in range(reps["interrupt"]):
            bg = g.run("import time\nwhile True:\n    time.sleep(0.005)", background=True, sink=sink)
            time.sleep(1.0)
            t0 = time.perf_counter()
            g.interrupt()
            try:
                bg.wait()
            except BaseException as exc:  # noqa: BLE001 - the interrupted cell ends in an error, as it should
                if "KeyboardInterrupt" not in str(exc):  # anything else (its re-forming failed) is a finding
                    print(f"  N={n}: interrupt ended in {type(exc).__name__}: {str(exc).splitlines()[0]}",
                          flush=True)
            times.append(time.perf_counter() - t0)
        res["interrupt"]["ours"] = statistics.median(times)
        if n >= 2:
            try:  # a failed recovery is a finding, printed; the other sizes still run
                times = []
                for _ in range(reps["restart"]):
                    victim = g.slots[n - 1].info["pid"]
                    os.kill(victim, signal.SIGKILL)
                    deadline = time.monotonic() + 60
                    while not any(s.state == "dead" for s in g.status()) and time.monotonic() < deadline:
                        time.sleep(0.1)
                    t0 = time.perf_counter()
                    g.restart()
                    times.append(time.perf_counter() - t0)
                res["restart"]["ours"] = statistics.median(times)
                t0 = time.perf_counter()
                g.rescale(max(1, n // 2))
                g.rescale(n)
                res["rescale"]["ours"] = time.perf_counter() - t0
            except Exception as exc:  # noqa: BLE001
                print(f"  N={n}: restart or rescale FAILED: {type(exc).__name__}: {str(exc).splitlines()[0]}",
                      flush=True)
                res["errors"] = {"recovery": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    finally:
        dash.close()
        t0 = time.perf_counter()
        g.shutdown()
        res["shutdown"]["ours"] = time.perf_counter() - t0
    for op, value in _bare_floors(n, cpus, spread).items():
        res[op]["floor"] = value
    # an interrupted cell ends with the process group formed again (a rank may have been stopped in a collective)
    res["interrupt"]["floor"] = res["noop"]["floor"] + res["restart"]["floor"]
    return res


def _start_layout(layout: str) -> Any:
    """Connect this process to Ray for ``layout``; returns the Cluster to shut down (or None)."""
    import ray

    if layout == "one":
        from raytrain_nb._internal import cluster

        os.environ["RAYTRAIN_NB_NUM_CPUS"] = str(int(TOTAL_CPUS))
        cluster.connect()
        return None
    from ray.cluster_utils import Cluster

    os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")  # a loaded machine starts raylets slowly
    for attempt in (1, 2):
        c = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "object_store_memory": 100 * 1024 * 1024})
        try:
            for _ in range(4):
                c.add_node(num_cpus=int(TOTAL_CPUS // 4), object_store_memory=100 * 1024 * 1024)
            ray.init(address=c.address, log_to_driver=False)
            return c
        except Exception as exc:  # noqa: BLE001 - "node timed out during startup" under load: once more
            print(f"  four raylets did not start (attempt {attempt}): {str(exc).splitlines()[0]}", flush=True)
            ray.shutdown()
            c.shutdown()
            if attempt == 2:
                raise
    return None


def _plot(table: Dict[str, Dict[int, Dict[str, Dict[str, float]]]], path: str) -> Optional[str]:
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure as MplFigure
    except ImportError:
        return "matplotlib is not installed: no plot (pip install matplotlib)"
    fig = MplFigure(figsize=(16, 10), dpi=80)
    FigureCanvasAgg(fig)
    for i, op in enumerate(OPS):
        ax = fig.add_subplot(3, 4, i + 1)
        for layout, style in (("one", "-"), ("four", "--")):
            rows = table.get(layout, {})
            ns = sorted(n for n in rows if rows[n][op].get("ours") is not None)
            if not ns:
                continue
            ax.plot(ns, [rows[n][op]["ours"] * 1e3 for n in ns], "o" + style, color="#1565c0",
                    label=f"ours, {layout} raylet{'s' if layout == 'four' else ''}")
            fl = [n for n in ns if rows[n][op].get("floor") == rows[n][op].get("floor")]
            ax.plot(fl, [rows[n][op]["floor"] * 1e3 for n in fl], "s" + style, color="#888",
                    label=f"floor, {layout}")
        ax.set_title(LABELS[op], fontsize=10)
        ax.set_xlabel("ranks")
        ax.set_ylabel("ms")
        ax.grid(True, alpha=0.3)
        if i == 0:
            ax.legend(fontsize=7)
    fig.suptitle(f"cost against group size (load average {loadavg()} on {os.cpu_count()} CPUs)")
    fig.tight_layout()
    fig.savefig(path)
    return None


def run(quick: bool = False, sizes: Optional[Sequence[int]] = None, layouts: Optional[Sequence[str]] = None,
        ) -> List[Figure]:
    import ray

    single_thread()
    sizes = tuple(sizes or ((1, 2, 4) if quick else SIZES))
    layouts = tuple(layouts or (("one",) if quick else ("one", "four")))
    reps = {k: max(1, v // 2) for k, v in REPS.items()} if quick else dict(REPS)
    table: Dict[str, Dict[int, Dict[str, Dict[str, float]]]] = {}
    loads: Dict[str, str] = {}
    for layout in layouts:
        section(f"21. scale on {'one raylet' if layout == 'one' else 'four raylets (Cluster, SPREAD)'}: "
                f"sizes {', '.join(map(str, sizes))}")
        try:
            c = _start_layout(layout)
        except Exception as exc:  # noqa: BLE001 - the other layout's figures still count
            print(f"  ERROR: {layout} layout could not start: {exc}", flush=True)
            continue
        try:
            for n in sizes:
                t0 = time.perf_counter()
                try:
                    row = table.setdefault(layout, {})[n] = _measure(n, layout, reps)
                except Exception as exc:  # noqa: BLE001 - the sizes measured so far still count
                    print(f"  N={n}: FAILED: {type(exc).__name__}: {str(exc).splitlines()[0]}", flush=True)
                    table[layout].pop(n, None)
                    continue
                loads[f"{layout}-{n}"] = loadavg()
                with open(os.path.join(RESULTS_DIR, "scale_table.json"), "w") as fh:  # what ran so far, kept
                    json.dump({"table": table, "loads": loads}, fh, indent=1)
                print(f"  N={n:>2} ({time.perf_counter() - t0:.0f} s, load {loadavg()}): " + ", ".join(
                    f"{op} {row[op].get('ours', float('nan')) * 1e3:.0f}/{row[op].get('floor', float('nan')) * 1e3:.0f}"
                    for op in OPS) + " ms (ours/floor)", flush=True)
        finally:
            ray.shutdown()
            if c is not None:
                c.shutdown()
    return _figures(table, loads)


def _figures(table: Dict[str, Dict[int, Dict[str, Dict[str, float]]]], loads: Dict[str, str]) -> List[Figure]:
    figures: List[Figure] = []
    lines = ["| layout | op | " + " | ".join(f"N={n} ours / floor (ms)" for n in sorted(next(iter(table.values()))))
             + " | slope ours / floor (ms a rank) |"]
    for layout, rows in table.items():
        ns = sorted(rows)
        for i, op in enumerate(OPS):
            pts = [(n, rows[n][op].get("ours"), rows[n][op].get("floor")) for n in ns]
            pts = [(n, o, f) for n, o, f in pts if o is not None and f is not None and f == f]
            cells = " | ".join(f"{rows[n][op]['ours'] * 1e3:.0f} / {rows[n][op].get('floor', float('nan')) * 1e3:.0f}"
                               if rows[n][op].get("ours") is not None else "-" for n in ns)
            if len(pts) < 2:
                lines.append(f"| {layout} | {LABELS[op]} | {cells} | - |")
                continue
            so = _slope([p[0] for p in pts], [p[1] for p in pts])
            sf = _slope([p[0] for p in pts], [p[2] for p in pts])
            lines.append(f"| {layout} | {LABELS[op]} | {cells} | {so * 1e3:.2f} / {sf * 1e3:.2f} |")
            figures.append(Figure(f"21{chr(ord('a') + i)}-{layout}", f"{LABELS[op]}: slope over N, ours / floor "
                                  f"({layout} raylet{'s' if layout == 'four' else ''})",
                                  so / max(sf, MIN_FLOOR_SLOPE), "x", "<", 1.5,
                                  spread=f"ours {so * 1e3:.2f} ms/rank, floor {sf * 1e3:.2f} ms/rank",
                                  note=f"N={','.join(str(p[0]) for p in pts)}",
                                  detail={"points": pts}))
        noop = [rows[n]["noop"]["ours"] / rows[n]["noop"]["floor"] for n in ns]
        figures.append(Figure(f"21n-{layout}", f"no-op cell / Worker.ping floor, worst N ({layout})", max(noop), "x",
                              "<", 1.5, spread=" ".join(f"N={n}:{r:.2f}" for n, r in zip(ns, noop))))
        big = max(n for n in ns if rows[n]["restart"].get("ours") is not None) if any(
            rows[n]["restart"].get("ours") is not None for n in ns) else None
        if big and big > 2 and 2 in rows:
            allowed = rows[2]["restart"]["ours"] + rows[big]["restart"]["floor"] - rows[2]["restart"]["floor"]
            figures.append(Figure(f"21r-{layout}", f"restart at N={big} / (restart at 2 + floor growth) ({layout})",
                                  rows[big]["restart"]["ours"] / allowed, "x", "<", 1.0,
                                  spread=f"{rows[big]['restart']['ours']:.2f} s vs {allowed:.2f} s allowed"))
    os.makedirs(RESULTS_DIR, exist_ok=True)
    note = _plot(table, os.path.join(RESULTS_DIR, "scale.png"))
    with open(os.path.join(RESULTS_DIR, "scale.md"), "w") as fh:
        fh.write("\n".join(lines) + f"\n\nload averages per size: {loads}\n" + (f"\n{note}\n" if note else ""))
    with open(os.path.join(RESULTS_DIR, "scale_table.json"), "w") as fh:
        json.dump({"table": table, "loads": loads}, fh, indent=1)
    print("\n".join(lines))
    if note:
        print(note)
    return figures


def _chosen(name: str) -> List[str]:
    """A comma-separated choice from the environment (``BENCH_SCALE_SIZES=1,2,4,8``, ``BENCH_SCALE_LAYOUTS=one``)."""
    return [s.strip() for s in os.environ.get(name, "").split(",") if s.strip()]


def run_chosen(quick: bool = False) -> List[Figure]:
    """:func:`run` with the sizes and layouts the environment chooses (default: all, or the quick set)."""
    return run(quick=quick, sizes=[int(s) for s in _chosen("BENCH_SCALE_SIZES")],
               layouts=_chosen("BENCH_SCALE_LAYOUTS"))


if __name__ == "__main__":
    from common import run_standalone

    sys.exit(run_standalone(run_chosen, __doc__, "scale", "sizes 1, 2, 4 on one raylet, fewer repetitions"))
