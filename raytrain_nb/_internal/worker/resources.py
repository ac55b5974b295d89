"""What a worker process uses: CPU %, RSS, its memory limit, and its GPU, sampled at most once a second.

The memory limit is the container's cgroup limit where there is one, else the node's memory times Ray's OOM
threshold (``RAY_memory_usage_threshold``, 0.95 by default): past it Ray's memory monitor kills workers. A
worker above ``MEMORY_WARN_SHARE`` of that limit is flagged. The GPU is read through NVML (``nvidia-ml-py``)
when it is installed, else from ``torch.cuda``'s memory statistics once CUDA is initialised (never by us).
"""
from __future__ import annotations

import logging
import os
import sys
import threading
import time
from typing import Any, Dict, Optional

logger = logging.getLogger(__name__)

#: A sample is taken at most this often (every poll in between gets the last one).
SAMPLE_EVERY_S = 1.0
#: A rank using more than this share of its memory limit is flagged.
MEMORY_WARN_SHARE = 0.9
#: Ray's default OOM threshold (share of the node's memory), when ``RAY_memory_usage_threshold`` is not set.
RAY_OOM_THRESHOLD = 0.95

_CGROUP_FILES = (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                 ("/sys/fs/cgroup/memory/memory.limit_in_bytes", "/sys/fs/cgroup/memory/memory.usage_in_bytes"))


def _read_int(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            text = f.read().strip()
    except OSError:
        return None
    return int(text) if text.isdigit() else None


def cgroup_memory() -> Optional[Dict[str, int]]:
    """``{"limit", "used"}`` of this container's cgroup, or None without a limit (or when unreadable)."""
    for limit_file, usage_file in _CGROUP_FILES:
        limit = _read_int(limit_file)
        if limit is not None and limit < 1 << 60:  # cgroup v1 writes a huge number for "no limit"
            used = _read_int(usage_file)
            if used is not None:
                return {"limit": limit, "used": used}
    return None


def memory_limit(psutil: Any) -> Dict[str, Any]:
    """How much memory this worker may use and how much is used against it, and what the limit is."""
    cgroup = cgroup_memory()
    if cgroup is not None:
        return {"mem_used": cgroup["used"], "mem_limit": cgroup["limit"], "mem_limit_kind": "cgroup"}
    vm = psutil.virtual_memory()
    try:
        threshold = float(os.environ.get("RAY_memory_usage_threshold", RAY_OOM_THRESHOLD))
    except ValueError:
        threshold = RAY_OOM_THRESHOLD
    return {"mem_used": int(vm.total - vm.available), "mem_limit": int(vm.total * threshold),
            "mem_limit_kind": "node"}


class _Nvml:
    """NVML handles of the GPUs this process sees (``CUDA_VISIBLE_DEVICES``), or None without NVML."""

    def __init__(self) -> None:
        self.handle: Any = None
        self.lib: Any = None
        try:
            import pynvml  # nvidia-ml-py: optional; without it torch.cuda's memory statistics are used

            pynvml.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip() or "0"
            self.handle = (pynvml.nvmlDeviceGetHandleByUUID(visible) if not visible.isdigit()
                           else pynvml.nvmlDeviceGetHandleByIndex(int(visible)))
            self.lib = pynvml
        except Exception as exc:  # noqa: BLE001 - no NVML, no GPU or no driver: torch.cuda is next
            logger.debug("NVML not used: %s", exc)

    def sample(self) -> Optional[Dict[str, Any]]:
        if self.handle is None:
            return None
        util = self.lib.nvmlDeviceGetUtilizationRates(self.handle)
        mem = self.lib.nvmlDeviceGetMemoryInfo(self.handle)
        return {"gpu_util": float(util.gpu), "gpu_mem": int(mem.used), "gpu_mem_total": int(mem.total),
                "gpu_source": "nvml"}


def torch_gpu() -> Optional[Dict[str, Any]]:
    """The current CUDA device's memory as torch's allocator sees it, if torch initialised CUDA."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    device = torch.cuda.current_device()
    return {"gpu_util": None, "gpu_mem": int(torch.cuda.memory_reserved(device)),
            "gpu_mem_total": int(torch.cuda.get_device_properties(device).total_memory), "gpu_source": "torch"}


class ResourceSampler:
    """This process's resources, sampled at most every ``every_s`` (thread-safe; the control thread asks)."""

    def __init__(self, every_s: float = SAMPLE_EVERY_S) -> None:
        self.every_s = every_s
        self._lock = threading.Lock()
        self._last: Dict[str, Any] = {}
        self._at = float("-inf")
        self._process: Any = None
        self._nvml: Optional[_Nvml] = None

    def sample(self) -> Dict[str, Any]:
        """The latest sample: ``cpu`` (%, of one core), ``rss`` (bytes), ``mem_used`` / ``mem_limit`` (bytes) and
        ``mem_flag`` (above ``MEMORY_WARN_SHARE`` of the limit), ``gpu_util`` (%) / ``gpu_mem`` (bytes) on a GPU,
        and ``time``; empty when psutil is missing."""
        now = time.monotonic()
        with self._lock:
            if now - self._at < self.every_s:
                return self._last
            self._at = now
            try:
                self._last = self._take()
            except Exception as exc:  # noqa: BLE001 - resources are shown when known, never break a poll
                logger.debug("resource sample failed: %s", exc)
            return self._last

    def _take(self) -> Dict[str, Any]:
        import psutil  # psutil: a declared dependency, loaded on the first sample (not on import)

        if self._process is None:
            self._process = psutil.Process()
            self._process.cpu_percent(None)  # the first call only starts the count
        out: Dict[str, Any] = {"cpu": self._process.cpu_percent(None), "rss": self._process.memory_info().rss,
                               "time": time.time()}
        out.update(memory_limit(psutil))
        out["mem_flag"] = out["mem_used"] > MEMORY_WARN_SHARE * out["mem_limit"]
        if self._nvml is None and os.environ.get("CUDA_VISIBLE_DEVICES"):
            self._nvml = _Nvml()
        gpu = (self._nvml.sample() if self._nvml is not None else None) or torch_gpu()
        if gpu:
            out.update(gpu)
        return out
