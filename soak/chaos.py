"""The chaos soak: a seeded random sequence of what users do to a 2-3 worker group, with faults at
random moments, and checks after every step. ``make soak DURATION=120 SEED=7`` or::

    .venv/bin/python -m soak.chaos --duration 120 --seed 7 [--workers 2] [--kernel-share 0.2]
    .venv/bin/python -m soak.chaos --replay "ep:py:fn:2,snap,kill_ckpt:1:0.12"

It prints its seed and every step token; the same seed, or ``--replay`` with the tokens, repeats the
sequence. Exit status 1 on any violation (a hang, an unnamed failure, a lost or damaged checkpoint,
ranks that differ, a group that does not recover, actors or placement groups left after shutdown).
"""
from __future__ import annotations

import argparse
import logging
import os
import random
import sys
import tempfile
import threading
import time
from typing import Any, List, Optional

from .programs import DEFAULT_STYLES, STYLES


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    """The command line (see the module docstring)."""
    p = argparse.ArgumentParser(prog="python -m soak.chaos", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--duration", type=float, default=120, help="seconds of steps (Ray's start included)")
    p.add_argument("--seed", type=int, default=None, help="seed of every random choice (default: random, printed)")
    p.add_argument("--workers", type=int, choices=[2, 3], default=2, help="size each new group starts with")
    p.add_argument("--kernel-share", type=float, default=0.2, help="share of steps driven through a kernel's magics")
    p.add_argument("--replay", default=None, help="comma-separated step tokens to run instead of a random plan")
    p.add_argument("--weights", default="", help="override step weights, e.g. kill_rescale=0,bg=8")
    p.add_argument("--styles", default="", help="setup styles to draw from (default: "
                   f"{','.join(DEFAULT_STYLES)}; also {','.join(s for s in STYLES if s not in DEFAULT_STYLES) or '-'})")
    p.add_argument("--ballast-mb", type=float, default=24, help="a tracked, untrained module this big (MB) makes "
                   "snapshot writes slow enough to be hit by a fault")
    p.add_argument("--recover", choices=["random", "restart", "rescale"], default="random",
                   help="how a group with dead ranks is recovered after a step (default: a seeded choice)")
    p.add_argument("--grace", type=float, default=0, help="after a call misses its deadline (a violation), wait this "
                   "many seconds more: a call that then returns is an 'over deadline' and the soak goes on; one that "
                   "does not is a 'hang' and stops it")
    p.add_argument("--heartbeat", type=float, default=5.0, help="heartbeat timeout (s) of Python-driven groups")
    p.add_argument("--out", default=None, help="folder for the step list, notes, stacks and runs (default: a temp dir)")
    p.add_argument("--lib", default=None, help="import raytrain_nb from this folder (e.g. an unpacked `git archive`), "
                   "here, in the workers and in the kernel")
    p.add_argument("--keep", action="store_true", help="keep the runs' storage even when everything passed")
    return p.parse_args(argv)


def _setup_env(args: argparse.Namespace, out_dir: str) -> str:
    """Environment for Ray, the workers and the kernel; returns the working directory (run from there so
    neither Ray's workers nor the kernel pick up another copy of the library from the current folder)."""
    if args.lib:
        lib = os.path.abspath(args.lib)
        sys.path.insert(0, lib)
        os.environ["PYTHONPATH"] = lib + (os.pathsep + os.environ["PYTHONPATH"] if os.environ.get("PYTHONPATH") else "")
    os.environ.setdefault("RAYTRAIN_NB_NUM_CPUS", "8")
    os.environ.setdefault("RAYTRAIN_NB_OBJECT_STORE_BYTES", str(150 * 1024 * 1024))
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    work = os.path.join(out_dir, "work")
    os.makedirs(work, exist_ok=True)
    os.chdir(work)
    return work


def _connect() -> str:
    """Start the embedded Ray instance (the library retries a slow start); returns its GCS address."""
    from raytrain_nb._internal import cluster  # the same start as every group and the test suite

    started = time.monotonic()
    for attempt in range(1, 4):
        try:
            cluster.connect()
            break
        except Exception as exc:  # noqa: BLE001 - a slow machine: try again
            print(f"ray start attempt {attempt} failed: {exc}", flush=True)
            if attempt == 3:
                raise
    import ray

    print(f"ray started in {time.monotonic() - started:.1f} s", flush=True)
    return ray.get_runtime_context().gcs_address


def _kill_children() -> None:
    """SIGKILL the processes this one started (Ray's, the kernel), by pid: used only when a hang
    leaves no clean way out."""
    try:
        import psutil

        for child in psutil.Process().children(recursive=True):
            try:
                child.kill()
            except psutil.Error:
                pass
    except ImportError:
        pass


def _bounded(fn: Any, seconds: float) -> None:
    t = threading.Thread(target=fn, daemon=True)
    t.start()
    t.join(seconds)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the plan; print the summary and the replay line. Returns 0, 1 (violations) or 2 (the soak failed)."""
    args = parse_args(argv)
    args.seed = args.seed if args.seed is not None else random.randrange(1 << 31)
    out_dir = os.path.abspath(args.out or tempfile.mkdtemp(prefix=f"raytrain-soak-{args.seed}-"))
    os.makedirs(out_dir, exist_ok=True)
    work = _setup_env(args, out_dir)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    t0 = time.monotonic()
    print(f"soak: seed {args.seed}, duration {args.duration:g} s, workers {args.workers}, kernel share "
          f"{args.kernel_share:g}, output in {out_dir}", flush=True)

    from . import plan
    from .driver_kernel import KernelDriver
    from .driver_py import PyDriver
    from .runner import EpisodeOver, Hung, Runner
    from .steps import STEPS

    import raytrain_nb

    print(f"soak: raytrain_nb from {os.path.dirname(raytrain_nb.__file__)}", flush=True)
    address = _connect()
    storage = os.path.join(out_dir, "runs")
    os.makedirs(storage, exist_ok=True)

    def make_driver(kind: str) -> Any:
        return PyDriver(storage, args.heartbeat) if kind == "py" else KernelDriver(storage, work, address)

    styles = [s for s in args.styles.split(",") if s] or None
    replay = [t for t in args.replay.split(",") if t.strip()] if args.replay else None
    planner = plan.Planner(args.seed, args.workers, args.kernel_share, plan.parse_weights(args.weights),
                           **({"styles": styles} if styles else {}), replay=replay)
    rn = Runner(args, make_driver, out_dir)
    done: List[str] = []
    episode = None
    hung = False
    harness_error = False
    steps_file = open(os.path.join(out_dir, "steps.txt"), "w")
    try:
        for token in planner:
            if replay is None and time.monotonic() - t0 > args.duration:
                break
            name, a = plan.parse(token)
            rn.index += 1
            rn.local = 0 if name == "ep" else rn.local + 1
            rn.token = token
            rn.stats.steps += 1
            done.append(token)
            steps_file.write(token + "\n")
            steps_file.flush()
            print(f"[{rn.index:4d} {time.monotonic() - t0:7.1f}s] {token}"
                  + (f"  ({rn.d.kind})" if rn.d is not None and name != "ep" else ""), flush=True)
            try:
                if name == "ep":
                    episode = (a[0], a[1], int(a[2]))
                    rn.begin_episode(*episode)
                    rn.after_step()
                    continue
                if rn.d is None:
                    if episode is None:
                        raise ValueError("a replayed plan must start with an episode token (ep:py:fn:2)")
                    print("    (a new group for the same episode)", flush=True)
                    rn.begin_episode(*episode)
                STEPS[name](rn, a)
                rn.after_step()
            except EpisodeOver as exc:
                print(f"    episode over: {exc}", flush=True)
                try:
                    rn.end_episode()
                except EpisodeOver:
                    pass
    except Hung:
        hung = True
    except KeyboardInterrupt:
        print("soak: interrupted", flush=True)
    except Exception:  # noqa: BLE001 - the soak's own failure: shown, the run ends with status 2
        import traceback

        traceback.print_exc()
        harness_error = True
    finally:
        steps_file.close()
        if not hung:
            try:
                rn.end_episode()
            except (EpisodeOver, Hung) as exc:
                print(f"soak: final shutdown: {exc}", flush=True)
                hung = hung or isinstance(exc, Hung)
        print(rn.stats.summary(args.seed, {"operations": 300, "faults": 40, "faults during a checkpoint write": 5,
                                           "faults during a rescale": 5} if args.duration >= 1800 else None))
        first_ep = max((i for i, t in enumerate(done) if t.startswith("ep:")), default=0)
        print(f"\nseed {args.seed}; steps ({len(done)}) in {out_dir}/steps.txt; replay with:\n"
              f"  python -m soak.chaos --replay \"{','.join(done)}\"")
        if rn.stats.violations:
            last = done[first_ep:]
            print(f"  (from the last episode: --replay \"{','.join(last)}\")")
        for drv in rn.drivers.values():
            _bounded(drv.close, 60)
        if hung:  # a call still runs in some thread: no clean exit; stop Ray's and the kernel's processes
            sys.stdout.flush()
            sys.stderr.flush()
            _kill_children()
            os._exit(1)
        import ray

        _bounded(ray.shutdown, 60)
        if not rn.stats.violations and not args.keep:  # keep steps.txt; the runs, notes and work dir go
            import glob
            import shutil

            shutil.rmtree(storage, ignore_errors=True)
            shutil.rmtree(work, ignore_errors=True)
            for notes in glob.glob(os.path.join(out_dir, "notes-e*.jsonl")):
                os.remove(notes)
    return 1 if rn.stats.violations else 2 if harness_error else 0


if __name__ == "__main__":
    sys.exit(main())
