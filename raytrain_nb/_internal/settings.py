"""Every environment variable raytrain_nb reads for its own configuration: name, type, default, meaning, reader.

Each variable is declared once here as a :class:`Setting` and read through the function below it, at call time
(never at import: tests and notebooks set variables while the process runs). No other module of the package reads
a ``RAYTRAIN_NB_*`` variable (``tests/unit/test_settings.py`` checks it), and the README's table of variables is
checked against :data:`SETTINGS`.

Not here: what the package only sets for processes it starts (``MASTER_ADDR``, ``RANK``,
``CUDA_VISIBLE_DEVICES``, ``GLOO_SOCKET_IFNAME``, ``TF_CONFIG``, ...), and Ray's and Tune's own variables
(``RAY_ADDRESS``, ``RAY_AUTH_*``, ``RAY_ENABLE_AUTO_CONNECT``, ``TUNE_DISABLE_AUTO_INIT``, ...), which keep the
meaning Ray gives them and are read where the package follows Ray's rules. Imports nothing of ours.
"""
from __future__ import annotations

import dataclasses
import os
from typing import Optional, Tuple


@dataclasses.dataclass(frozen=True)
class Setting:
    """One environment variable: its name, type, default and meaning (one line, as the README shows it).

    ``default`` is the value that applies when the variable is unset, as it would be written in the environment;
    ``None`` when what applies is computed (``when_unset`` says what).
    """

    name: str
    type: str
    default: Optional[str]
    meaning: str
    when_unset: str = ""

    def raw(self) -> Optional[str]:
        """The variable's value now, or None when it is unset."""
        return os.environ.get(self.name)

    def value(self) -> str:
        """The variable's value now, or its default when unset (``""`` for one without a fixed default)."""
        raw = self.raw()
        return raw if raw is not None else (self.default or "")

    def documented_default(self) -> str:
        return f"`{self.default}`" if self.default is not None else self.when_unset


#: Seconds a rank waits in ``collective.barrier()`` / ``broadcast_from_rank_zero()`` for the others (torch's and Ray
#: Train's ``TorchConfig`` default for a process group's collectives).
DEFAULT_COLLECTIVE_TIMEOUT_S = 1800.0
CELL_CHANNEL = Setting("RAYTRAIN_NB_CELL_CHANNEL", "bool", "1",
                       "`0` sends cells, pulls, rollbacks and loads to ranks on the driver's machine as Ray calls, "
                       "not over their loopback connection")
COLLECTIVE_TIMEOUT_S = Setting("RAYTRAIN_NB_COLLECTIVE_TIMEOUT_S", "float", "1800",
                               "seconds a rank waits in `collective.barrier()` or `broadcast_from_rank_zero()` for "
                               "the other ranks before it fails naming those that did not arrive")
DASHBOARD = Setting("RAYTRAIN_NB_DASHBOARD", "bool", "0",
                    "`1` starts Ray's dashboard with the embedded instance")
ELASTIC_WAIT_S = Setting("RAYTRAIN_NB_ELASTIC_WAIT_S", "float", "10",
                         "seconds an elastic `fit()` waits for a lost worker's place before it continues with the "
                         "survivors (read once, when the trainer is first imported)")
INSTANCE_DIR = Setting("RAYTRAIN_NB_INSTANCE_DIR", "str", None,
                       "the folder of the record that names the shared Ray instance keep-alive groups run on",
                       when_unset="`$XDG_RUNTIME_DIR/raytrain_nb`, else `~/.raytrain_nb`")
LEAN_ENTRY = Setting("RAYTRAIN_NB_LEAN_ENTRY", "bool", "1",
                     "`0` starts Ray's Python processes as Ray does, not through `lean_entry.py`")
MEMORY_BYTES = Setting("RAYTRAIN_NB_MEMORY_BYTES", "int", None,
                       "the memory the embedded instance sizes itself from, in bytes",
                       when_unset="the cgroup memory limit, else physical memory")
NUM_CPUS = Setting("RAYTRAIN_NB_NUM_CPUS", "float", None, "the CPUs of the embedded instance",
                   when_unset="the fewest of the cores this process may run on and the cgroup CPU quota")
NUM_GPUS = Setting("RAYTRAIN_NB_NUM_GPUS", "float", None, "the GPUs of the embedded instance",
                   when_unset="Ray's count")
OBJECT_STORE_BYTES = Setting("RAYTRAIN_NB_OBJECT_STORE_BYTES", "int", None,
                             "the embedded instance's object store, in bytes (`0`: the default)",
                             when_unset="a tenth of the memory, 80 MiB to 2 GiB")
#: Characters per second let through (below Jupyter Server's default of 1 MB/s, which counts bytes of the JSON
#: messages).
DEFAULT_OUTPUT_RATE = 300_000
OUTPUT_RATE = Setting("RAYTRAIN_NB_OUTPUT_RATE", "int", str(DEFAULT_OUTPUT_RATE),
                      "characters of worker output a second shown in a cell (`0`: no cap; not a number: the default)")
RESOURCE_WAIT_S = Setting("RAYTRAIN_NB_RESOURCE_WAIT_S", "float", "120",
                          "seconds a fixed-size `fit()` waits for a lost worker's place before it fails (read once, "
                          "when the trainer is first imported)")
DEFAULT_STORAGE_PATH = "~/raytrain_nb_results"
STORAGE_PATH = Setting("RAYTRAIN_NB_STORAGE_PATH", "str", DEFAULT_STORAGE_PATH,
                       "where run directories live: a path or any fsspec URL shared by all workers")
UI = Setting("RAYTRAIN_NB_UI", "str", "auto",
             "the dashboard: `auto` (widgets in a Jupyter kernel, text elsewhere), `widgets`, `text` or `none`")
WORKING_DIR = Setting("RAYTRAIN_NB_WORKING_DIR", "bool", "1",
                      "`0`: the notebook's folder is never shipped to a remote cluster (pass a `runtime_env` "
                      "yourself)")

#: Every variable, in the README's order.
SETTINGS: Tuple[Setting, ...] = (CELL_CHANNEL, COLLECTIVE_TIMEOUT_S, DASHBOARD, ELASTIC_WAIT_S, INSTANCE_DIR, LEAN_ENTRY, MEMORY_BYTES, NUM_CPUS,
                                 NUM_GPUS, OBJECT_STORE_BYTES, OUTPUT_RATE, RESOURCE_WAIT_S, STORAGE_PATH, UI,
                                 WORKING_DIR)


def cell_channel() -> bool:
    """Whether cells go to ranks on the driver's machine over their loopback channel (anything but ``0``)."""
    return CELL_CHANNEL.value() != "0"


def collective_timeout_s() -> float:
    """Seconds a rank waits in a collective of ``raytrain_nb.collective`` (unset or blank: 1800).

    Raises:
        ValueError: not a positive number, naming the value and the fix.
    """
    raw = (COLLECTIVE_TIMEOUT_S.raw() or "").strip()
    if not raw:
        return DEFAULT_COLLECTIVE_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0 or value == float("inf"):
        raise ValueError(f"{COLLECTIVE_TIMEOUT_S.name}={raw!r} is not a number of seconds above 0: set it to e.g. "
                         f"600, or unset it for {DEFAULT_COLLECTIVE_TIMEOUT_S:g}")
    return value


def dashboard() -> bool:
    """Whether the embedded instance starts Ray's dashboard (only ``1`` turns it on)."""
    return DASHBOARD.value() == "1"


def elastic_wait_s() -> float:
    """Seconds an elastic run waits for a lost worker's place before it continues without it."""
    return float(ELASTIC_WAIT_S.value())


def instance_dir() -> str:
    """The folder of the shared instance's record (unset or blank: the user's runtime folder, else ``~/.raytrain_nb``)."""
    raw = (INSTANCE_DIR.raw() or "").strip()
    if raw:
        return os.path.expanduser(raw)
    runtime = os.environ.get("XDG_RUNTIME_DIR", "").strip()
    return os.path.join(runtime, "raytrain_nb") if runtime else os.path.expanduser("~/.raytrain_nb")


def lean_entry() -> bool:
    """Whether Ray's Python processes start through ``lean_entry.py`` (anything but ``0``)."""
    return LEAN_ENTRY.value() != "0"


def memory_bytes() -> Optional[int]:
    """The memory to size the embedded instance from, or None (unset or empty: the limit of the machine)."""
    raw = MEMORY_BYTES.raw()
    return int(float(raw)) if raw else None


def num_cpus() -> Optional[float]:
    """The embedded instance's CPUs, or None (unset or empty: the container's limit)."""
    raw = NUM_CPUS.raw()
    return float(raw) if raw else None


def num_gpus() -> Optional[float]:
    """The embedded instance's GPUs, or None (unset or empty: Ray counts them)."""
    raw = NUM_GPUS.raw()
    return float(raw) if raw else None


def object_store_bytes() -> int:
    """The embedded instance's object store in bytes; 0 (also when unset) means the default size."""
    raw = OBJECT_STORE_BYTES.raw()
    return int(raw) if raw is not None else 0


def output_rate() -> int:
    """Characters a second of worker output shown in a cell; 0 is no cap; unset, empty or not a number: the default."""
    raw = OUTPUT_RATE.raw() or ""
    try:
        return int(raw) if raw.strip() else DEFAULT_OUTPUT_RATE
    except ValueError:
        return DEFAULT_OUTPUT_RATE


def resource_wait_s() -> float:
    """Seconds a fixed-size run waits for a lost worker's place before it fails."""
    return float(RESOURCE_WAIT_S.value())


def storage_path() -> Optional[str]:
    """The storage path set by the user (stripped), or None when unset or blank (then the default applies)."""
    return (STORAGE_PATH.raw() or "").strip() or None


def ui() -> str:
    """The dashboard mode asked for, lower case (unset or blank: ``auto``); the notebook layer checks it."""
    return UI.value().strip().lower() or "auto"


def working_dir() -> bool:
    """Whether the notebook's folder may be shipped to a remote cluster (anything but ``0``)."""
    return WORKING_DIR.value() != "0"
