"""Connect to Ray: an embedded local instance by default, an existing cluster otherwise.

The embedded instance is quiet (no log flood in the notebook, no dashboard),
sized for a small machine, runs with Ray's token authentication on (set
explicitly, the token file readable by its owner only), and is started at most
once per process; a "node timed out during startup" (seen on loaded machines)
is retried. The notebook's folder is shipped only to a cluster with nodes on
other machines, without secrets, and only when small (``shipping.py``).
"""
from __future__ import annotations

import logging
import os
import secrets
import signal
import stat
import tempfile
import threading
from pathlib import Path
from typing import Any, Dict, List, Optional

from . import instance, settings, shipping
from .lean_head import lean_head
from .lean_entry import defer_iri_grammar
from .processes import children, end_children
from .errors import GroupError

logger = logging.getLogger(__name__)

_STARTUP_ATTEMPTS = 3
#: In the command line of every process ``ray.init`` starts (its binaries and scripts are in Ray's package).
RAY_PROCESSES = os.sep + "ray" + os.sep
_MIN_OBJECT_STORE = 80 * 1024 * 1024
_MAX_OBJECT_STORE = 2 * 1024 ** 3

_started_by_us = False
_on_shared = False  # connected to the shared instance keep-alive groups run on (instance.py)
_shipped_working_dir = False
_lock = threading.Lock()

#: Ray's switch (read by the driver, the GCS, raylets and workers) and its token sources, in Ray's order.
AUTH_MODE_ENV = "RAY_AUTH_MODE"
TOKEN_ENV = "RAY_AUTH_TOKEN"
TOKEN_PATH_ENV = "RAY_AUTH_TOKEN_PATH"


def _memory_limit() -> int:
    """Memory available to this process: ``RAYTRAIN_NB_MEMORY_BYTES``, the cgroup limit or physical memory."""
    told = settings.memory_bytes()
    if told is not None:
        return told
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


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def cgroup_cpu_quota() -> Optional[float]:
    """The container's CPU quota in CPUs (cgroup v2 ``cpu.max``, v1 ``cfs_quota_us``), None when unlimited."""
    v2 = _read("/sys/fs/cgroup/cpu.max").split()
    if len(v2) == 2 and v2[0] != "max":
        return int(v2[0]) / int(v2[1])
    quota, period = _read("/sys/fs/cgroup/cpu/cpu.cfs_quota_us"), _read("/sys/fs/cgroup/cpu/cpu.cfs_period_us")
    if quota.lstrip("-").isdigit() and int(quota) > 0 and period.isdigit() and int(period) > 0:
        return int(quota) / int(period)
    return None


def cpu_limit() -> int:
    """CPUs this process may use: the fewest of the cores it may run on and the container's CPU quota
    (as Binder and Kubernetes set it), at least 1; not the host's core count."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    quota = cgroup_cpu_quota()
    if quota is not None:
        cores = min(cores, max(1, int(quota + 0.5)))  # 1.5 CPUs of quota: 2 workers' worth of time slices
    return max(1, cores)


SHARED_MEMORY = "/dev/shm"


def _shared_memory_bytes() -> int:
    """Free bytes in /dev/shm, where Ray keeps its object store when it fits (a container's is often 64 MB)."""
    try:
        st = os.statvfs(SHARED_MEMORY)
    except OSError:
        return 0
    return st.f_bavail * st.f_frsize


def local_init_kwargs() -> Dict[str, Any]:
    """Arguments for ``ray.init`` of the embedded instance (env overrides apply)."""
    store = settings.object_store_bytes() or min(
        _MAX_OBJECT_STORE, max(_MIN_OBJECT_STORE, _memory_limit() // 10)
    )
    kwargs: Dict[str, Any] = {
        "include_dashboard": settings.dashboard(),
        "log_to_driver": False,
        "logging_level": logging.WARNING,
        "object_store_memory": store,
        "configure_logging": True,
    }
    if _shared_memory_bytes() < store:  # a container's small /dev/shm (Docker's and Binder's 64 MB)
        kwargs["_plasma_directory"] = tempfile.gettempdir()
        logger.info("the object store (%d MB) lives in %s: /dev/shm is smaller", store // 2**20,
                    kwargs["_plasma_directory"])
    # the container's limits, not the host's cores (Ray counts the host's); RAYTRAIN_NB_NUM_CPUS overrides
    cpus = settings.num_cpus()
    kwargs["num_cpus"] = cpus if cpus is not None else float(cpu_limit())
    gpus = settings.num_gpus()
    if gpus is not None:
        kwargs["num_gpus"] = gpus
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


def on_shared_instance() -> bool:
    """Whether this process is connected to the shared instance that keep-alive groups run on."""
    return _on_shared


def connect(address: Optional[str] = None, shared: bool = False) -> None:
    """Make sure this process is connected to Ray (never calls ``ray.init`` twice).

    Args:
        address: a Ray address (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``);
            defaults to ``RAY_ADDRESS``, else an embedded local instance.
        shared: without an address, connect to the shared instance that outlives kernels (``instance.py``: found by
            our record, started when none runs) instead of starting one that ends with this process.

    Raises:
        GroupError: connected elsewhere already, or Ray could not start; ``shared`` while this process runs an
            instance of its own.
    """
    global _started_by_us, _shipped_working_dir, _on_shared
    defer_iri_grammar()  # before Ray's first import in this process (lean_entry.py says why)
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    # Ray announces token authentication when it turns it on by default; ours is set explicitly, the notice goes.
    logging.getLogger("ray._private.authentication.authentication_token_setup").setLevel(logging.ERROR)
    with _lock:
        address = address or os.environ.get("RAY_ADDRESS") or None
        if ray.is_initialized():
            if shared and _started_by_us and not address:
                raise GroupError("this kernel's Ray instance ends with the kernel, so a keep-alive group cannot run "
                                 "on it: %dist_shutdown its groups and call ray.shutdown() (or restart the kernel), "
                                 "then start the group with --keep-alive first")
            return
        if not address:
            enable_token_auth()
        in_main = threading.current_thread() is threading.main_thread()
        sigint = signal.getsignal(signal.SIGINT) if in_main else None
        last: Optional[BaseException] = None
        for attempt in range(1, _STARTUP_ATTEMPTS + 1):
            before = children(RAY_PROCESSES)
            try:
                if address:
                    _shipped_working_dir = _init_remote(ray, address)
                elif shared:
                    record = instance.find_or_start()
                    ray.init(address=record["address"], namespace=record["namespace"], log_to_driver=False,
                             logging_level=logging.WARNING)
                    _on_shared, _shipped_working_dir = True, False
                else:
                    # Ray starts workers at niceness 15; training ranks should not yield to everything else.
                    os.environ.setdefault("RAY_worker_niceness", "0")
                    # "local": a new instance even if `ray start` left one running on this machine
                    with lean_head():
                        ray.init(address="local", **local_init_kwargs())
                    _check_token_auth()
                    _started_by_us, _shipped_working_dir = True, False
                last = None
                break
            except Exception as exc:  # noqa: BLE001 - retried or re-raised below
                last = exc
                try:
                    ray.shutdown()
                except Exception:
                    pass
                end_children(children(RAY_PROCESSES) - before)  # a start that failed midway leaves Ray's processes
                if isinstance(exc, GroupError):
                    break  # ours, final, and its message says what to do
                transient = "timed out during startup" in str(exc) or "timed out" in str(exc).lower()
                logger.warning("ray.init attempt %d/%d failed: %s", attempt, _STARTUP_ATTEMPTS, exc)
                if not transient or address:
                    break
            finally:
                if in_main and sigint is not None and signal.getsignal(signal.SIGINT) is not sigint:
                    signal.signal(signal.SIGINT, sigint)  # never replace IPython's handler
        if last is None:
            _quiet_raylet_messages()
        if isinstance(last, GroupError):
            raise last
        if last is not None:
            where = f"the Ray cluster at {address!r}" if address else "a local Ray instance"
            raise GroupError(f"could not connect to {where}: {last}") from last


def token_file() -> Optional[Path]:
    """The file Ray reads its token from: ``RAY_AUTH_TOKEN_PATH``, else ``~/.ray/auth_token``.

    None when ``RAY_AUTH_TOKEN`` holds the token itself (Ray's first source).
    """
    if os.environ.get(TOKEN_ENV, "").strip():
        return None
    named = os.environ.get(TOKEN_PATH_ENV, "").strip()
    return Path(named).expanduser() if named else Path.home() / ".ray" / "auth_token"


def _has_token(path: Path) -> bool:
    """Whether ``path`` holds a token (Ray strips whitespace; an empty or unreadable file holds none)."""
    try:
        return bool(path.read_text(errors="replace").strip())
    except OSError:
        return False


def _write_token(path: Path) -> None:
    """A new random token (as Ray makes them) in ``path``, readable by its owner only, never over another's."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600 from the start
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(secrets.token_hex(32))
            fh.flush()
            os.fsync(fh.fileno())
        try:
            os.link(tmp, path)  # atomic, and fails if another process wrote a token meanwhile
        except OSError:  # the file exists (another process's token, or empty), or no hard links here
            if _has_token(path):
                logger.debug("Ray's token file %s was written by another process meanwhile; using it", path)
                return
            os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    logger.debug("created Ray's token file %s, readable by its owner only (mode 0600)", path)


def enable_token_auth() -> None:
    """Turn Ray's token authentication on for the embedded instance, explicitly, whatever Ray's default.

    Sets ``RAY_AUTH_MODE=token`` (inherited by the GCS, raylet and workers this process starts, and re-read by
    this process's Ray config) and makes sure a token exists: ``RAY_AUTH_TOKEN``, the file
    ``RAY_AUTH_TOKEN_PATH`` names, or ``~/.ray/auth_token``, which is created (mode 0600) when missing.

    Raises:
        GroupError: ``RAY_AUTH_TOKEN_PATH`` names a missing or empty file.
    """
    from ray._raylet import Config  # ray: loaded when a group or trainer runs, not on import raytrain_nb

    mode = os.environ.get(AUTH_MODE_ENV)
    if mode is not None and mode.strip().lower() != "token":
        logger.warning("%s=%s ignored: the embedded Ray instance always runs with token authentication",
                       AUTH_MODE_ENV, mode)
    os.environ[AUTH_MODE_ENV] = "token"
    Config.initialize("")  # Ray caches its config per process: read RAY_AUTH_MODE again, as ray.init does
    path = token_file()
    if path is None:
        logger.debug("Ray token authentication on; the token comes from %s", TOKEN_ENV)
    elif _has_token(path):
        mode_bits = stat.S_IMODE(path.stat().st_mode)
        if mode_bits & 0o077:  # the user's own file: told, not changed
            logger.info("Ray's token file %s is readable by other users (mode %o): chmod 600 %s", path, mode_bits, path)
        else:
            logger.debug("Ray token authentication on; token file %s (mode %o)", path, mode_bits)
    elif os.environ.get(TOKEN_PATH_ENV, "").strip():
        raise GroupError(f"{TOKEN_PATH_ENV}={path} names no file holding a token: write one there "
                         f"(`ray get-auth-token --generate` prints one) or unset {TOKEN_PATH_ENV}")
    else:
        _write_token(path)


def _check_token_auth() -> None:
    """Refuse an embedded instance that came up without token authentication (a Ray that ignores the switch)."""
    import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb
    from ray._private.authentication.authentication_utils import is_token_auth_enabled  # ray: as above

    if not is_token_auth_enabled():
        raise GroupError(f"the embedded Ray instance (ray {ray.__version__}) started without token "
                         f"authentication although {AUTH_MODE_ENV}=token: pip install -U 'ray>=2.59'")


def _secret_files() -> List[str]:
    """Files never shipped whatever their name: Ray's token files."""
    named = os.environ.get(TOKEN_PATH_ENV, "").strip()
    return [str(Path.home() / ".ray" / "auth_token")] + ([str(Path(named).expanduser())] if named else [])


def _init_remote(ray: Any, address: str) -> bool:
    """Connect to an existing cluster; ship the notebook's folder (Ray's runtime_env) only to other machines.

    Connects without a runtime_env first and reads the cluster's nodes: where every node runs on this machine
    (``ray start --head`` here, a cluster of local raylets), workers use the folder in place and nothing is
    copied. Otherwise the folder, secrets and environments left out, is checked against the size limit and the
    driver reconnects with it.

    Returns whether the folder was shipped (disabled, same machine or failed: workers use the filesystem).

    Raises:
        GroupError: the folder is over the limit (the connection is closed; nothing was uploaded).
    """
    # one namespace: another kernel connected to the cluster finds the detached actors of keep-alive groups there
    common = dict(address=address, namespace=instance.NAMESPACE, log_to_driver=False, logging_level=logging.WARNING)
    ray.init(**common)
    if not settings.working_dir():
        return False
    if not shipping.should_ship(False, ray.nodes(), shipping.this_machine_addresses()):
        logger.debug("every node of the cluster at %s runs on this machine: the folder is used in place", address)
        return False
    selection = shipping.select(os.getcwd(), secret_files=_secret_files(),
                                include_gitignore=os.environ.get("RAY_RUNTIME_ENV_IGNORE_GITIGNORE", "0") != "1")
    shipping.check_size(selection)
    ray.shutdown()
    try:
        ray.init(runtime_env={"working_dir": selection.folder, "excludes": list(selection.excludes)}, **common)
        logger.debug("shipped %d files (%.1f MB) of %s to the cluster", len(selection.files),
                     selection.size / 1e6, selection.folder)
        return True
    except Exception as exc:  # noqa: BLE001 - e.g. the upload failed
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
