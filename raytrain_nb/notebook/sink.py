"""Worker output rendered in a Jupyter cell: text streams, rich display data, the cell's value."""
from __future__ import annotations

import re
import sys
from typing import Any, Dict, List, Optional, Tuple

from IPython.display import publish_display_data

from .._internal.output import Labeller, OutputSink
from .ratecap import RateCap


class MimeBundle:
    """A value already rendered on a worker; IPython shows it as the cell's ``Out``."""

    def __init__(self, data: Dict[str, Any], metadata: Optional[Dict[str, Any]] = None) -> None:
        self.data = data
        self.metadata = metadata or {}

    def _repr_mimebundle_(self, include: Any = None, exclude: Any = None) -> Tuple[Dict[str, Any], Dict[str, Any]]:
        return self.data, self.metadata

    def __repr__(self) -> str:
        return str(self.data.get("text/plain", ""))


#: A worker's notice of output it dropped (``worker/capture.py``: its buffer was full, the driver slow to drain).
_DROPPED = re.compile(r"\n?\[(\d+) characters of output dropped\]\n")


class NotebookSink(OutputSink):
    """Streams into the running cell's output; display data via IPython's publisher."""

    def __init__(self) -> None:
        self._label = Labeller()
        self._cap = RateCap()
        self.values: List[Tuple[int, MimeBundle]] = []

    def stream(self, rank: int, name: str, text: str, label: bool) -> None:
        target = sys.stderr if name == "stderr" else sys.stdout
        dropped = _DROPPED.findall(text)
        if dropped:  # a worker's count of what it could not buffer is never itself held back
            text = _DROPPED.sub("", text)
            sys.stderr.write("".join(f"[rank {rank}: {n} characters of output dropped]\n" for n in dropped))
            sys.stderr.flush()
        shown, notice = self._cap.admit(self._label(rank, name, text) if label else text)
        if notice:
            sys.stderr.write(notice)
            sys.stderr.flush()
        if shown:
            target.write(shown)
            target.flush()

    def close(self) -> None:
        """The cell ended: say how much output was held back at its end, if any."""
        notice = self._cap.flush()
        if notice:
            sys.stderr.write(notice)
            sys.stderr.flush()

    def display(self, rank: int, data: Dict[str, Any], metadata: Dict[str, Any], label: bool) -> None:
        if label:
            sys.stdout.write(f"[rank {rank}]\n")
            sys.stdout.flush()
        publish_display_data(data, metadata)

    def value(self, rank: int, data: Dict[str, Any], metadata: Dict[str, Any], label: bool) -> None:
        if label:
            text = data.get("text/plain", "")
            if set(data) == {"text/plain"}:
                self.stream(rank, "stdout", text.rstrip("\n") + "\n", True)
            else:
                self.display(rank, data, metadata, True)
            return
        self.values.append((rank, MimeBundle(data, metadata)))

    def cell_value(self) -> Optional[MimeBundle]:
        """The value to return from the magic (shown as ``Out[n]``)."""
        return self.values[0][1] if self.values else None
