"""Connect to Ray: an embedded local instance by default, an existing cluster otherwise.

The embedded instance is quiet (no log flood in the notebook, no dashboard),
sized for a small machine, and started at most once per process; a
"node timed out during startup" (seen on loaded machines) is retried.
"""
from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any, Dict, Optional

from .errors import GroupError

logger = logging.getLogger(__name__)

_STARTUP_ATTEMPTS = 3
_MIN_OBJECT_STORE = 80 * 1024 * 1024
_MAX_OBJECT_STORE = 2 * 1024 ** 3

_started_by_us = False
_shipped_working_dir = False
_lock = threading.Lock()
_EXCLUDES = [".git", ".venv", "venv", "__pycache__", ".ipynb_checkpoints", "*.pt", "*.ckpt", "*.tar", "*.zip"]


def _memory_limit() -> int:
    """Memory available to this process: the cgroup limit or physical memory."""
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            raw = open(path).read().strip()
            if raw.isdigit() and int(raw) < 1 << 50:
                return int(raw)
        except OSError:
            continue
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 4 * 1024 ** 3


def local_init_kwargs() -> Dict[str, Any]:
    """Arguments for ``ray.init`` of the embedded instance (env overrides apply)."""
    store = int(os.environ.get("RAYTRAIN_NB_OBJECT_STORE_BYTES", 0)) or min(
        _MAX_OBJECT_STORE, max(_MIN_OBJECT_STORE, _memory_limit() // 10)
    )
    kwargs: Dict[str, Any] = {
        "include_dashboard": os.environ.get("RAYTRAIN_NB_DASHBOARD", "0") == "1",
        "log_to_driver": False,
        "logging_level": logging.WARNING,
        "object_store_memory": store,
        "configure_logging": True,
    }
    if os.environ.get("RAYTRAIN_NB_NUM_CPUS"):
        kwargs["num_cpus"] = float(os.environ["RAYTRAIN_NB_NUM_CPUS"])
    if os.environ.get("RAYTRAIN_NB_NUM_GPUS"):
        kwargs["num_gpus"] = float(os.environ["RAYTRAIN_NB_NUM_GPUS"])
    return kwargs


def _quiet_raylet_messages() -> None:
    """Send Ray's "(raylet) A worker died ..." notices to our log instead of the notebook.

    Ray prints them from a background thread into whatever cell runs at that
    moment; the group reports the same death with the rank and the recovery
    commands, in the cell where it happened.
    """
    import ray._private.worker as ray_worker  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    original = ray_worker.print_to_stdstream
    if getattr(original, "_rtnb_quiet", False):
        return

    def quiet(data: Dict[str, Any], ignore_prefix: bool) -> None:
        if data.get("pid") == "raylet":
            for line in data.get("lines", []):
                logger.debug("raylet: %s", line)
            return
        original(data, ignore_prefix)

    quiet._rtnb_quiet = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = quiet


def started_by_us() -> bool:
    """Whether this process started the Ray instance it is connected to."""
    return _started_by_us


def connect(address: Optional[str] = None) -> None:
    """Make sure this process is connected to Ray (never calls ``ray.init`` twice).

    Args:
        address: a Ray address (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``);
            defaults to ``RAY_ADDRESS``, else an embedded local instance.

    Raises:
        GroupError: connected elsewhere already, or Ray could not start.
    """
    global _started_by_us, _shipped_working_dir
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    # Ray says on every start that token authentication is on; it stays on, the notice goes.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    with _lock:
        if ray.is_initialized():
            return
        address = address or os.environ.get("RAY_ADDRESS") or None
        in_main = threading.current_thread() is threading.main_thread()
        sigint = signal.getsignal(signal.SIGINT) if in_main else None
        last: Optional[BaseException] = None
        for attempt in range(1, _STARTUP_ATTEMPTS + 1):
            try:
                if address:
                    _shipped_working_dir = _init_remote(ray, address)
                else:
                    # Ray starts workers at niceness 15; training ranks should not yield to everything else.
                    os.environ.setdefault("RAY_worker_niceness", "0")
                    # "local": a new instance even if `ray start` left one running on this machine
                    ray.init(address="local", **local_init_kwargs())
                    _started_by_us = True
                last = None
                break
            except Exception as exc:  # noqa: BLE001 - retried or re-raised below
                last = exc
                transient = "timed out during startup" in str(exc) or "timed out" in str(exc).lower()
                logger.warning("ray.init attempt %d/%d failed: %s", attempt, _STARTUP_ATTEMPTS, exc)
                try:
                    ray.shutdown()
                except Exception:
                    pass
                if not transient or address:
                    break
            finally:
                if in_main and sigint is not None and signal.getsignal(signal.SIGINT) is not sigint:
                    signal.signal(signal.SIGINT, sigint)  # never replace IPython's handler
        if last is None:
            _quiet_raylet_messages()
        if last is not None:
            where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
            raise GroupError(f"could not connect to {where}: {last}") from last


def _init_remote(ray: Any, address: str) -> bool:
    """Connect to an existing cluster; ship the notebook's folder to its workers (Ray's runtime_env).

    Returns whether the folder was shipped (too large or disabled: workers must share the filesystem).
    """
    common = dict(address=address, log_to_driver=False, logging_level=logging.WARNING)
    if os.environ.get("RAYTRAIN_NB_WORKING_DIR", "1") != "0":
        try:
            ray.init(runtime_env={"working_dir": os.getcwd(), "excludes": _EXCLUDES}, **common)
            return True
        except Exception as exc:  # noqa: BLE001 - e.g. the folder is over Ray's upload limit
            if "timed out" in str(exc).lower():
                raise
            logger.warning("the notebook's folder was not shipped to the workers (%s); modules in it are "
                           "importable on workers only through a shared filesystem", str(exc).splitlines()[0])
            ray.shutdown()
    ray.init(**common)
    return False


def shipped_working_dir() -> bool:
    """Whether workers run in a copy of the notebook's folder (a remote cluster)."""
    return _shipped_working_dir


def driver_node_id() -> str:
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    return ray.get_runtime_context().get_node_id()
