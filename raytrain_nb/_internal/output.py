"""Where a group's worker output goes on the driver (the notebook layer plugs in its own)."""
from __future__ import annotations

import sys
from typing import Any, Dict, Optional, Sequence, Tuple

OUTPUT_MODES = ("rank0", "all", "none")


class OutputSink:
    """Receives worker output on the driver. Subclass to render it elsewhere.

    ``label`` is True when several ranks are shown (``--output all``).
    """

    def stream(self, rank: int, name: str, text: str, label: bool) -> None:
        raise NotImplementedError

    def display(self, rank: int, data: Dict[str, Any], metadata: Dict[str, Any], label: bool) -> None:
        raise NotImplementedError

    def value(self, rank: int, data: Dict[str, Any], metadata: Dict[str, Any], label: bool) -> None:
        """The value of a cell's last expression."""
        self.display(rank, data, metadata, label)

    def notice(self, text: str) -> None:
        """A message from the group itself (a rank did not stop, ...)."""
        sys.stderr.write(text.rstrip("\n") + "\n")
        sys.stderr.flush()


class Labeller:
    """Prefixes each line with ``[rank N] ``, remembering where each stream's line began."""

    def __init__(self) -> None:
        self._at_line_start: Dict[Tuple[int, str], bool] = {}

    def __call__(self, rank: int, name: str, text: str) -> str:
        key = (rank, name)
        prefix = f"[rank {rank}] "
        start = self._at_line_start.get(key, True)
        lines = text.split("\n")
        out = []
        for i, line in enumerate(lines):
            last = i == len(lines) - 1
            if last and line == "":
                break
            if i > 0 or start:
                line = prefix + line
            out.append(line)
        self._at_line_start[key] = text.endswith("\n")
        return "\n".join(out) + ("\n" if text.endswith("\n") else "")


class TextSink(OutputSink):
    """Writes worker output to this process's stdout/stderr (scripts, plain terminals)."""

    def __init__(self, show_values: bool = False) -> None:
        self._label = Labeller()
        self.show_values = show_values

    def stream(self, rank: int, name: str, text: str, label: bool) -> None:
        target = sys.stderr if name == "stderr" else sys.stdout
        target.write(self._label(rank, name, text) if label else text)
        target.flush()

    def display(self, rank: int, data: Dict[str, Any], metadata: Dict[str, Any], label: bool) -> None:
        text = data.get("text/plain", "")
        if text:
            self.stream(rank, "stdout", text.rstrip("\n") + "\n", label)

    def value(self, rank: int, data: Dict[str, Any], metadata: Dict[str, Any], label: bool) -> None:
        if self.show_values:
            self.display(rank, data, metadata, label)


class CollectSink(OutputSink):
    """Keeps everything in lists (tests, programmatic use)."""

    def __init__(self) -> None:
        self.streams: list = []
        self.displays: list = []
        self.values: list = []
        self.notices: list = []

    def stream(self, rank: int, name: str, text: str, label: bool) -> None:
        self.streams.append((rank, name, text))

    def display(self, rank: int, data: Dict[str, Any], metadata: Dict[str, Any], label: bool) -> None:
        self.displays.append((rank, data))

    def value(self, rank: int, data: Dict[str, Any], metadata: Dict[str, Any], label: bool) -> None:
        self.values.append((rank, data))

    def notice(self, text: str) -> None:
        self.notices.append(text)

    def text(self, name: Optional[str] = None) -> str:
        return "".join(t for _, n, t in self.streams if name is None or n == name)


def route(sink: OutputSink, rank: int, items: Sequence[Tuple[str, Any]], shown: Sequence[int], mode: str) -> None:
    """Send one rank's output items to the sink if this rank's output is shown."""
    if mode == "none" or rank not in shown:
        return
    label = mode == "all"
    for kind, payload in items:
        if kind == "display":
            data, md = payload
            sink.display(rank, data, md, label)
        else:
            sink.stream(rank, kind, payload, label)
