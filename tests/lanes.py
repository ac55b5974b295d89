"""Two lanes of tests on one machine, with the machine to itself for a test that needs it.

``make test LANES=2`` runs the suite in two pytest-xdist workers (``-n 2 --dist loadfile``: a module's tests stay
in one worker, in order, so a module's group and kernel are shared as before; the Makefile says why it is not the
default). A test marked ``exclusive`` (a timing bound,
or a load that must not meet another test's) runs with the other lane stopped at its next test boundary.

Two lock files make that a readers-writer lock with writer preference:
- every other test takes the gate for a moment, then the main lock shared;
- an exclusive test takes the gate, then the main lock exclusive (waiting out the test the other lane is in), then
  lets the gate go. Meanwhile the other lane cannot pass the gate, so the exclusive test never waits more than one
  test of the other lane.
A lane keeps the main lock exclusive from one exclusive test to the next (a module of them runs as one stretch); it
lets it go before any other test. Each test's setup and teardown (its module's fixtures included) are inside the
lock, so a module's group starts and stops under the same rule as its tests.

Modules with an exclusive test go out first. An exclusive test waits for the test the other lane is in; were that
one of the long single tests (the Ray Train examples, the elastic run, a browser), a test of 2 s would wait minutes.
The modules without one come after every exclusive test has run, when the two lanes no longer wait for each other.

Without xdist (one process) nothing is locked and the order is as collected. ``RAYTRAIN_NB_LANES_LOG=FILE``
appends, per test, its lane, how it ran, how long it waited to start and how long it took (where a run's time went).
"""
from __future__ import annotations

import fcntl
import os
import tempfile
import time
from pathlib import Path
from typing import List, Optional

import pytest

# An exclusive test waits for one test of the other lane; a lane that is not let in within this long names what
# it waited for (the other lane's test is bounded by pytest-timeout well before this).
WAIT_S = 1800.0
_POLL_S = 0.05


def _lane_dir() -> Optional[Path]:
    """The folder both workers' lock files are in (one per run), or None outside xdist."""
    run = os.environ.get("PYTEST_XDIST_TESTRUNUID")
    if not os.environ.get("PYTEST_XDIST_WORKER") or not run:
        return None
    path = Path(tempfile.gettempdir()) / f"raytrain-nb-lanes-{run}"
    path.mkdir(exist_ok=True)
    return path


class Lanes:
    """This worker's side of the lock (see the module's docstring)."""

    def __init__(self, folder: Path) -> None:
        self._gate = os.open(folder / "gate", os.O_RDWR | os.O_CREAT, 0o600)
        self._main = os.open(folder / "main", os.O_RDWR | os.O_CREAT, 0o600)
        self.held: Optional[int] = None  # fcntl.LOCK_SH, fcntl.LOCK_EX or None

    def _take(self, fd: int, mode: int, what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while True:
            try:
                fcntl.flock(fd, mode | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise RuntimeError(f"waited {WAIT_S:g} s for {what}: the other test lane did not let go") from None
                time.sleep(_POLL_S)

    def enter(self, exclusive: bool) -> None:
        """Hold the main lock the way the next test needs it."""
        want = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        if self.held == want:
            return
        if self.held is not None:
            self.leave()
        self._take(self._gate, fcntl.LOCK_EX, "the lanes' gate")
        try:
            self._take(self._main, want, "the machine to itself" if exclusive else "a shared turn")
        finally:
            fcntl.flock(self._gate, fcntl.LOCK_UN)
        self.held = want

    def leave(self) -> None:
        """Let the main lock go."""
        if self.held is not None:
            fcntl.flock(self._main, fcntl.LOCK_UN)
            self.held = None


def _log(item: pytest.Item, lanes: Lanes, waited: float, took: float) -> None:
    path = os.environ.get("RAYTRAIN_NB_LANES_LOG")
    if path:
        mode = "exclusive" if lanes.held == fcntl.LOCK_EX else "shared"
        with open(path, "a") as fh:
            fh.write(f"{os.environ.get('PYTEST_XDIST_WORKER')} {mode} {waited:.2f} {took:.2f} {item.nodeid}\n")


def _exclusive(item: Optional[pytest.Item]) -> bool:
    return item is not None and item.get_closest_marker("exclusive") is not None


_KEY = pytest.StashKey[Lanes]()


def pytest_configure(config: pytest.Config) -> None:
    folder = _lane_dir()
    if folder is not None:
        config.stash[_KEY] = Lanes(folder)


def pytest_collection_modifyitems(config: pytest.Config, items: List[pytest.Item]) -> None:
    if _KEY not in config.stash:  # one process: the order as collected
        return
    waits = {item.module.__name__ for item in items if _exclusive(item) and hasattr(item, "module")}
    items.sort(key=lambda item: getattr(item, "module", None) is None or item.module.__name__ not in waits)


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: Optional[pytest.Item]):
    lanes = item.config.stash.get(_KEY, None)
    if lanes is None:
        yield
        return
    asked = time.monotonic()
    lanes.enter(_exclusive(item))
    started = time.monotonic()
    try:
        yield
    finally:
        _log(item, lanes, started - asked, time.monotonic() - started)
        # An exclusive stretch goes on into the next exclusive test; anything else lets the other lane in.
        if not (lanes.held == fcntl.LOCK_EX and _exclusive(nextitem)):
            lanes.leave()
