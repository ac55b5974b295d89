"""What the driver may ask a worker about itself while a cell runs: where it is, what it uses, its debugger
(a part of :class:`~.actor.Worker`)."""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional

from .debugger import BRIDGE, Debugger
from .resources import ResourceSampler
from .where import watch_collectives, where

#: The calls of this part answered on the control channel (while a cell runs).
CONTROL_METHODS = ("where", "resources", "debug_input", "debug_end", "last_failure")


class InspectingWorker:
    """``where``, ``resources`` and the debugger of one rank."""

    namespace: Dict[str, Any]
    _cells: Any

    def _init_inspecting(self) -> None:
        self._sampler = ResourceSampler()
        self.debugger = Debugger(lambda: self._cells.ident)
        sys.breakpointhook = self.debugger.breakpoint_hook

    def _inspect_cell_begins(self) -> None:
        """A cell starts: the last failure's frames go, and torch.distributed's collectives are watched."""
        self.debugger.forget_failure()
        watch_collectives()

    def _inspect_poll(self) -> Dict[str, Any]:
        """What ``poll`` adds: the resources (sampled at most once a second) and an open debugger session."""
        return {"resources": self._sampler.sample(), "debug": BRIDGE.poll()}

    def where(self) -> Dict[str, Any]:
        """The cell thread's stack and the ``torch.distributed`` call it waits in (see ``worker/where.py``)."""
        return where(self._cells.ident, self._cells.current, self.namespace, debugging=BRIDGE.waiting)

    def resources(self) -> Dict[str, Any]:
        """CPU %, RSS, the memory limit and the GPU of this process (``worker/resources.py``)."""
        return self._sampler.sample()

    def debug_input(self, line: Optional[str], refuse: str = "") -> bool:
        """A line for the open debugger prompt (None: a person is at it); ``refuse``: no one will be."""
        return BRIDGE.send(line, refuse)

    def debug_end(self) -> bool:
        """End the open debugger session (Ctrl-C at the prompt): the paused code is interrupted."""
        return BRIDGE.end()

    def last_failure(self) -> Optional[str]:
        """``Type: message`` of the failure whose frames this rank keeps (until its next cell), or None."""
        return self.debugger.failure

    def post_mortem(self) -> str:
        """pdb on the last failure of this rank, on the cell thread, until the user quits it."""
        if self.debugger.failure is None:
            raise RuntimeError("no failure to debug on this rank: the last cell did not fail here")
        return self._cells.call(self.debugger.post_mortem)
