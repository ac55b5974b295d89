"""Figure 6: interrupting a rank blocked in DDP's backward, and releasing ranks after a divergent error.

Rank 1 spins in Python (``while True: pass``) while rank 0 calls ``loss.backward()`` on the DDP
model and blocks in its allreduce. After ~1 s the cell is interrupted three ways:

* ``api``:    ``group.interrupt()`` from a timer thread while the main thread is in ``run()``;
* ``ctrl-c``: ``run()`` in a thread, a ``KeyboardInterrupt`` injected into that thread (what the
  driver's Ctrl-C handling in ``Dispatch.collect`` sees);
* ``sigint``: ``run()`` in the main thread, a real SIGINT to this process (Jupyter's stop button).

Each is timed from the interrupt to ``run()`` returning (it raises ``WorkerError``). Separately,
a divergent error (rank 1 raises, rank 0 waits in DDP's backward) is timed from the start of the
cell to ``run()`` raising. After every repetition one DDP step runs on both ranks and the ranks'
parameters must agree: the group must be usable again.
"""
from __future__ import annotations

import ctypes
import os
import signal
import threading
import time
from typing import Any, Dict, List

from common import Figure, fmt_stats, section, stats
from workload import BLOCKED_CELL, CHECK_STEP_CELL, DIVERGENT_CELL

REPEATS = 5
BLOCK_S = 1.0


def _check_usable(group: Any) -> None:
    from raytrain_nb._internal.output import CollectSink

    assert group.state.value == "idle", f"group state after recovery: {group.state.value}"
    group.run(CHECK_STEP_CELL, sink=CollectSink())
    sums = group.pull("checksum", rank=None)
    assert max(sums) - min(sums) < 1e-6 * max(1.0, abs(sums[0])), f"ranks diverged: {sums}"


def _rank0_stack(group: Any) -> str:
    import ray

    return ray.get(group.slots[0].actor.stack.remote(), timeout=5)


def _failures(exc: Any) -> Dict[int, str]:
    return {f.rank: f.type_name + (" (collateral)" if f.collateral else "") for f in getattr(exc, "failures", [])}


def _blocked_run(group: Any, how: str, check_stack: bool) -> Dict[str, Any]:
    """Start the blocked cell, interrupt it after BLOCK_S by ``how``; return timings."""
    from raytrain_nb import WorkerError
    from raytrain_nb._internal.output import CollectSink

    out: Dict[str, Any] = {"how": how}
    done = threading.Event()

    def cell() -> None:
        try:
            group.run(BLOCKED_CELL, sink=CollectSink())
            out["error"] = "run() returned without an error"
        except WorkerError as exc:
            out["failures"] = _failures(exc)
        except BaseException as exc:  # noqa: BLE001
            out["error"] = f"{type(exc).__name__}: {exc}"
        out["t_end"] = time.perf_counter()
        done.set()

    def fire() -> None:
        time.sleep(BLOCK_S)
        if check_stack:
            out["stack"] = _rank0_stack(group)
            out["stack_ok"] = "backward" in out["stack"]
        out["t_int"] = time.perf_counter()
        if how == "api":
            out["interrupt_result"] = [r.get("state") for r in group.interrupt()]
            out["t_api_return"] = time.perf_counter()
        elif how == "ctrl-c":
            ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(runner.ident),
                                                       ctypes.py_object(KeyboardInterrupt))
        elif how == "sigint":
            os.kill(os.getpid(), signal.SIGINT)

    if how == "ctrl-c":
        runner = threading.Thread(target=cell, name="bench-run")
        runner.start()
        fire()
        done.wait(120)
        runner.join(5)
    else:  # run() on the main thread; the interrupt comes from a timer thread
        firer = threading.Thread(target=fire, name="bench-interrupt")
        firer.start()
        cell()
        firer.join(30)
    if "t_int" in out and "t_end" in out:
        out["to_return_s"] = out["t_end"] - out["t_int"]
    if "t_api_return" in out:
        out["api_call_s"] = out["t_api_return"] - out["t_int"]
    return out


def _divergent_run(group: Any) -> Dict[str, Any]:
    from raytrain_nb import WorkerError
    from raytrain_nb._internal.output import CollectSink

    out: Dict[str, Any] = {}
    t0 = time.perf_counter()
    try:
        group.run(DIVERGENT_CELL, sink=CollectSink())
        out["error"] = "run() returned without an error"
    except WorkerError as exc:
        out["failures"] = _failures(exc)
        out["released"] = list(getattr(exc, "released", ()))
    out["to_raise_s"] = time.perf_counter() - t0
    return out


def _time_reforms(group: Any) -> List[float]:
    """Record how long each re-forming of the process group takes (wraps the instance's method)."""
    spent: List[float] = []
    formation = getattr(group, "_formation", None)  # the group's own part that re-forms it (a bench may look in)
    if formation is None:  # the group renamed it: no breakdown, the figures still stand
        return spent
    original = formation.reform

    def timed_reform() -> None:
        t0 = time.perf_counter()
        try:
            original()
        finally:
            spent.append(time.perf_counter() - t0)

    formation.reform = timed_reform
    return spent


def _instrument_init(on: bool) -> bool:
    """(Worker side) time every ``torch.distributed.init_process_group`` call of this process."""
    import time as _time

    import torch.distributed as dist

    if on and not hasattr(dist, "_bench_orig_init"):
        dist._bench_orig_init = dist.init_process_group
        dist._bench_init_times = []

        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = _time.perf_counter()
            try:
                return dist._bench_orig_init(*args, **kwargs)
            finally:
                dist._bench_init_times.append(_time.perf_counter() - t0)

        dist.init_process_group = timed
    elif not on and hasattr(dist, "_bench_orig_init"):
        dist.init_process_group = dist._bench_orig_init
        del dist._bench_orig_init
    return True


def _init_times() -> List[float]:
    import torch.distributed as dist

    out = list(getattr(dist, "_bench_init_times", []))
    if hasattr(dist, "_bench_init_times"):
        dist._bench_init_times.clear()
    return out


def run(group: Any, repeats: int = REPEATS) -> List[Figure]:
    section(f"6. interrupt a rank blocked in DDP backward ({BLOCK_S:g} s in), release after a divergent error")
    assert threading.current_thread() is threading.main_thread()
    old = signal.signal(signal.SIGINT, signal.default_int_handler)
    samples: Dict[str, List[Dict[str, Any]]] = {"api": [], "ctrl-c": [], "sigint": [], "divergent": []}
    recover: List[float] = []
    reforms = _time_reforms(group)
    group.execute(_instrument_init, True)
    try:
        for i in range(repeats):
            for how in ("api", "ctrl-c", "sigint", "divergent"):
                reforms.clear()
                group.execute(_init_times)
                res = _divergent_run(group) if how == "divergent" else _blocked_run(group, how, check_stack=i == 0)
                res["reform_s"] = sum(reforms)
                res["init_pg_s"] = max((max(t) for t in group.execute(_init_times) if t), default=0.0)
                samples[how].append(res)
                if res.get("error"):
                    raise AssertionError(f"{how}: {res['error']}")
                if how != "divergent" and "stack_ok" in res:
                    assert res["stack_ok"], f"rank 0 was not in backward() when interrupted: {res['stack']}"
                t0 = time.perf_counter()
                _check_usable(group)
                recover.append(time.perf_counter() - t0)
    finally:
        signal.signal(signal.SIGINT, old)
        formation = getattr(group, "_formation", None)
        if formation is not None and "reform" in vars(formation):
            del formation.reform  # back to the class's method
        try:
            group.execute(_instrument_init, False)
        except Exception:  # noqa: BLE001 - the group may be broken if a repetition failed
            pass

    figs: List[Figure] = []
    for how, label in (("api", "group.interrupt() from a thread"), ("ctrl-c", "Ctrl-C in run()'s thread"),
                       ("sigint", "SIGINT to the driver")):
        s = stats([r["to_return_s"] for r in samples[how]])
        fails = samples[how][0].get("failures")
        rf = stats([r["reform_s"] for r in samples[how]])
        ip = stats([r["init_pg_s"] for r in samples[how]])
        print(f"  interrupt via {how:7s}: interrupt -> run() returns {fmt_stats(s, 1, 's', 3)}; "
              f"of which re-forming the process group {rf['median']:.3f} s "
              f"(init_process_group {ip['median']:.3f} s); failures {fails}")
        if how == "api":
            a = stats([r["api_call_s"] for r in samples[how]])
            print(f"                         group.interrupt() call itself {fmt_stats(a, 1, 's', 3)}; "
                  f"states {samples[how][0].get('interrupt_result')}")
        figs.append(Figure(f"6{'abc'[len(figs)]}", f"interrupt DDP-blocked rank: {label}", s["median"], "s", "<", 2.0,
                           spread=f"min-max {s['min']:.3f}-{s['max']:.3f}, n={s['n']}",
                           detail={"stats": s, "runs": [{k: v for k, v in r.items() if not k.startswith("t_")}
                                                        for r in samples[how]]}))
    s = stats([r["to_raise_s"] for r in samples["divergent"]])
    rf = stats([r["reform_s"] for r in samples["divergent"]])
    ip = stats([r["init_pg_s"] for r in samples["divergent"]])
    print(f"  divergent error: cell start -> WorkerError {fmt_stats(s, 1, 's', 3)}; "
          f"of which re-forming the process group {rf['median']:.3f} s (init_process_group {ip['median']:.3f} s); "
          f"failures {samples['divergent'][0].get('failures')}, released {samples['divergent'][0].get('released')}")
    r = stats(recover)
    print(f"  (not timed above) one DDP step after recovery: {fmt_stats(r, 1, 's', 3)}")
    figs.append(Figure("6d", "divergent error -> WorkerError", s["median"], "s", "<", 10.0,
                       spread=f"min-max {s['min']:.3f}-{s['max']:.3f}, n={s['n']}",
                       detail={"stats": s, "runs": samples["divergent"]}))
    return figs
