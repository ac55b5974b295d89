"""The shared instance's supervisor: starts the Ray head outside any kernel, and stops it once nothing needs it.

Run as ``python -m raytrain_nb._internal.supervisor LAUNCH`` by ``instance.py`` in a session of its own. It forks
once (its parent exits, so it is no kernel's child), starts the embedded instance as a kernel would
(``cluster.local_init_kwargs``, the lean head, token authentication) in the namespace :data:`instance.NAMESPACE`,
and writes the record kernels read to connect. Then, every second, it looks at Ray's tables: a driver other than
itself connected (the job table), or a custodian of a keep-alive group alive (``custodian.py``, named actors).
When neither has been seen for :data:`IDLE_S` (or none came within :data:`FIRST_S` of the start) it removes the
record and shuts the instance down, which ends every Ray process it started. A Ray actor cannot stop its own head:
this process can, because it started it. SIGTERM does the same at once.
"""
from __future__ import annotations

import logging
import os
import signal
import sys
import threading
import time
from typing import Any

from . import cluster, instance
from .lean_head import lean_head

#: Nothing needed the instance for this long: it stops (long enough for a kernel restart to connect again).
IDLE_S = 5.0
#: How long a new instance waits for its first driver.
FIRST_S = 120.0
#: Named actors whose name starts with this keep the instance (``group/custodian.py`` names them so).
CUSTODIAN_PREFIX = "rtnb-custodian:"

logger = logging.getLogger("raytrain_nb.supervisor")


def needed(ray: Any, own_job: str) -> str:
    """What keeps the instance now ("" when nothing): a connected driver, or a keep-alive group's custodian."""
    from ray._private.state import state  # ray: this process exists to run it

    drivers = [j for j in state.job_table() if not j["IsDead"] and j["JobID"] != own_job]
    if drivers:
        return f"{len(drivers)} driver(s) connected"
    custodians = [n for n in ray.util.list_named_actors() if n.startswith(CUSTODIAN_PREFIX)]
    return f"{len(custodians)} keep-alive group(s)" if custodians else ""


def serve(launch: str) -> None:
    cluster.enable_token_auth()
    os.environ.setdefault("RAY_worker_niceness", "0")
    import ray  # ray: this process exists to run it

    with lean_head():
        ray.init(address="local", namespace=instance.NAMESPACE, **cluster.local_init_kwargs())
    ctx = ray.get_runtime_context()
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, lambda *_: stop.set())
    me = os.getpid()
    instance.write_record({"address": ctx.gcs_address, "namespace": instance.NAMESPACE, "pid": me, "launch": launch,
                           "started": time.time()})
    logger.info("supervisor %s: instance at %s up (pid %d)", launch, ctx.gcs_address, me)
    own_job, started, last_needed, seen = ctx.get_job_id(), time.time(), time.time(), False
    try:
        while not stop.wait(1.0):
            try:
                why = needed(ray, own_job)
            except Exception as exc:  # noqa: BLE001 - a slow GCS: look again next second
                logger.warning("could not read Ray's tables: %s", exc)
                continue
            now = time.time()
            if why:
                seen, last_needed = True, now
            elif (seen and now - last_needed > IDLE_S) or (not seen and now - started > FIRST_S):
                logger.info("supervisor %s: nothing needs the instance (no driver, no keep-alive group): stopping",
                            launch)
                break
    finally:
        instance.remove_record(me)
        ray.shutdown()
        logger.info("supervisor %s: instance stopped", launch)


def main() -> None:
    launch = sys.argv[1] if len(sys.argv) > 1 else "?"
    if os.fork() > 0:  # the launcher's parent (the kernel) reaps this process; the child lives on beside it
        os._exit(0)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    try:
        serve(launch)
    except BaseException as exc:  # noqa: BLE001 - said in the log the kernel reads
        logger.error("supervisor %s failed: %s", launch, exc)
        raise


if __name__ == "__main__":
    main()
