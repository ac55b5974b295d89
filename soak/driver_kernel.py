"""Driving a group through a real Jupyter kernel's magics (``%%distributed``, ``%dist_checkpoint``, ...).

The kernel is driven with the test suite's ``tests/notebook/nbkernel.py`` and connects to the soak's
own Ray instance (``RAY_ADDRESS``), so the soak's leak check sees its actors too. What the magics do
not print (pids, digests) is read with small plain-Python cells that print one JSON line.
"""
from __future__ import annotations

import importlib
import json
import os
import sys
import time
from typing import Any, Callable, List, Optional, Tuple

from . import digest
from .watchdog import NAMED_KERNEL_ERRORS, Outcome

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TAG = "SOAKJSON"
Action = Optional[Callable[[bool], Any]]


def _nbkernel() -> Any:
    """The test suite's kernel helper, imported as part of the ``tests`` package (it imports ``tests.waiting``)."""
    if _REPO not in sys.path:
        sys.path.insert(0, _REPO)
    return importlib.import_module("tests.notebook.nbkernel")


_KERNEL_HELPERS = """
import json as _soak_json, raytrain_nb as _soak_rt
def _soak_emit(v):
    print("SOAKJSON" + _soak_json.dumps(v))
def _soak_status(ping=True):
    return [[s.rank, s.pid, str(getattr(s.state, 'value', s.state))] for s in _soak_rt.active_group().status(ping=ping)]
def _soak_state():
    g = _soak_rt.active_group()
    return None if g is None else str(getattr(g.state, 'value', g.state))
def _soak_written():
    t = getattr(_soak_rt.active_group().run_storage, 'background', None)
    return t is None or not t.is_alive()
"""


class KernelDriver:
    """A group started and driven by magics in one ipykernel (started once, reused by later episodes).

    Args:
        storage: the storage folder of the runs (``--storage``).
        workdir: the kernel's working directory.
        ray_address: the soak's Ray instance (GCS address) for the kernel to join.
    """

    kind = "kernel"

    def __init__(self, storage: str, workdir: str, ray_address: str) -> None:
        self.storage = storage
        self.workdir = workdir
        self.ray_address = ray_address
        self.k: Any = None
        self.run_name = ""
        self.pids: List[int] = []

    # -- the kernel ---------------------------------------------------------------------------

    def _ensure_kernel(self) -> None:
        if self.k is not None and self.k.km.is_alive():
            return
        env = {"RAYTRAIN_NB_UI": "text"}
        if os.environ.get("PYTHONPATH"):
            env["PYTHONPATH"] = os.environ["PYTHONPATH"]
        self.k = _nbkernel().Kernel(self.workdir, env=env)
        self.k.ok(f"import os\nos.environ['RAY_ADDRESS'] = {self.ray_address!r}\n%load_ext raytrain_nb", 120)
        with open(digest.__file__) as fh:
            self.k.ok(fh.read() + _KERNEL_HELPERS, 60)

    @property
    def kernel_pid(self) -> int:
        return self.k.pid if self.k is not None else 0

    def close(self) -> None:
        if self.k is not None:
            self.k.close()
            self.k = None

    # -- running code -------------------------------------------------------------------------

    def run_code(self, code: str, deadline_s: float, action: Optional[Callable[[bool], Any]] = None,
                 delay_s: float = 0.0, marker: Optional[str] = None) -> Tuple[Outcome, Any]:
        """Run one kernel cell; ``action(running)`` is called ``delay_s`` after it started (after ``marker``
        appeared in its output, when given). A cell still running at ``deadline_s`` is a hang."""
        started = time.monotonic()
        cell = self.k.submit(code)
        acted = None
        if action is not None:
            if marker:
                try:
                    self.k.wait_for(cell, lambda m: m.type == "stream" and marker in m.content.get("text", ""),
                                    timeout=30)
                except (AssertionError, TimeoutError):
                    pass
            ended = self._pump(cell, delay_s)
            acted = action(not ended)
        try:
            self.k.finish(cell, max(1.0, deadline_s - (time.monotonic() - started)))
        except TimeoutError:
            def later(seconds: float) -> Optional[Outcome]:
                try:
                    self.k.finish(cell, seconds)
                except TimeoutError:
                    return None
                return self._outcome(cell, time.monotonic() - started)

            return Outcome(ok=False, error_type="Hang", message=f"kernel cell still running after {deadline_s:g} s:\n"
                           f"{code[:300]}", named=False, hung=True, elapsed=deadline_s, later=later), acted
        return self._outcome(cell, time.monotonic() - started), acted

    @staticmethod
    def _outcome(cell: Any, elapsed: float) -> Outcome:
        if cell.status == "ok":
            return Outcome(ok=True, value=cell, elapsed=elapsed)
        ename, evalue = cell.reply.get("ename", "?"), cell.reply.get("evalue", "")
        text = evalue or cell.error_text
        return Outcome(ok=False, value=cell, error_type=ename, message=text[:2000],
                       named=ename in NAMED_KERNEL_ERRORS and bool(text.strip()), elapsed=elapsed)

    def _pump(self, cell: Any, seconds: float) -> bool:
        """Read the cell's messages for ``seconds``; True once it has ended."""
        def ended() -> bool:
            return any(m.type == "status" and m.content.get("execution_state") == "idle" for m in cell.msgs)

        end = time.time() + seconds  # nbkernel's deadlines are epoch seconds
        while time.time() < end and not ended():
            try:
                self.k._next(end, "pumping", cell)
            except TimeoutError:
                break
        return ended()

    def query(self, expr: str, deadline_s: float = 60) -> Outcome:
        """Evaluate ``expr`` in the kernel; ``value`` is what it printed as JSON."""
        out, _ = self.run_code(f"_soak_emit({expr})", deadline_s)
        if out.ok:
            lines = [l for l in out.value.stdout.splitlines() if l.startswith(_TAG)]
            out.value = json.loads(lines[-1][len(_TAG):]) if lines else None
        return out

    # -- the same operations as PyDriver, as magics --------------------------------------------

    def start(self, workers: int, run_name: str, deadline_s: float) -> Outcome:
        self._ensure_kernel()  # a kernel that does not start stops the soak (not the library's failure)
        self.run_name = run_name
        out, _ = self.run_code(f"%%distributed --workers {workers} --storage {self.storage} --name {run_name} "
                               "--no-dashboard\npass", deadline_s)
        if out.ok:
            self.refresh()
        return out

    def shutdown(self, deadline_s: float) -> Outcome:
        out, _ = self.run_code("%dist_shutdown", deadline_s)
        return out

    @property
    def run_dir(self) -> str:
        return os.path.join(self.storage, self.run_name)

    def cell(self, source: str, deadline_s: float, action: Action = None, delay_s: float = 0.0,
             marker: Optional[str] = None) -> Tuple[Outcome, Any]:
        return self.run_code("%%distributed\n" + source, deadline_s, action, delay_s, marker)

    def bg_start(self, source: str, deadline_s: float) -> Outcome:
        return self.run_code("%%distributed --background\n" + source, deadline_s)[0]

    def bg_wait(self, deadline_s: float) -> Outcome:
        return self.run_code("%dist_wait", deadline_s)[0]

    def bg_interrupt(self, deadline_s: float) -> Outcome:
        return self.run_code("%dist_interrupt", deadline_s)[0]

    def interrupt_action(self) -> Callable[[bool], Any]:
        """The stop button: SIGINT to the kernel while the cell runs."""
        return lambda running: self.k.interrupt()

    def checkpoint(self, name: str, blocking: bool, deadline_s: float, action: Action = None,
                   delay_s: float = 0.0) -> Tuple[Outcome, Any]:
        return self.run_code(f"%dist_checkpoint --name {name}" + ("" if blocking else " --async"), deadline_s,
                             action, delay_s)

    def checkpoint_written(self) -> bool:
        out = self.query("_soak_written()", 30)
        return bool(out.value) if out.ok else True

    def rollback(self, name: str, deadline_s: float) -> Outcome:
        return self.run_code(f"%dist_rollback {name}", deadline_s)[0]

    def restart(self, deadline_s: float, from_checkpoint: Optional[str] = None, action: Action = None,
                delay_s: float = 0.0) -> Tuple[Outcome, Any]:
        flag = f" --from-checkpoint {from_checkpoint}" if from_checkpoint else ""
        return self.run_code("%dist_restart" + flag, deadline_s, action, delay_s)

    def rescale(self, n: int, deadline_s: float, action: Action = None, delay_s: float = 0.0) -> Tuple[Outcome, Any]:
        return self.run_code(f"%dist_rescale {n}", deadline_s, action, delay_s)

    def status(self, deadline_s: float) -> Outcome:
        out = self.refresh(deadline_s)
        if out.ok and out.value is not None:
            out.value = [tuple(row) for row in out.value]
        return out

    def digests(self, deadline_s: float) -> Outcome:
        return self.query("soak_merge(_soak_rt.active_group().execute(soak_remote_digests))", deadline_s)

    def group_state(self) -> str:
        out = self.query("_soak_state()", 30)
        return str(out.value) if out.ok else "unknown"

    def size(self) -> int:
        return len(self.pids)

    def known_pids(self) -> List[int]:
        """Pids as last read (the kernel may be busy: no call)."""
        return list(self.pids)

    def refresh(self, deadline_s: float = 60) -> Outcome:
        """Read ``[(rank, pid, state)]`` through ``group.status()``; remembers the pids."""
        out = self.query("_soak_status()", deadline_s)
        if out.ok and out.value:
            self.pids = [row[1] for row in out.value]
        return out

    def driver_pid(self) -> int:
        return self.kernel_pid
