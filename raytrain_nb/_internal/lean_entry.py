"""The embedded instance's Python processes: Ray's own scripts, started without one slow import.

Ray imports ``jsonschema`` in every process (its runtime-env schemas), and ``jsonschema`` imports
``rfc3987_syntax`` when it is installed, as it is beside JupyterLab (``jupyter-events`` requires it):
that package builds a parser for the IRI grammar at import, about 1.2 s of CPU. Every worker
process paid it before it could run a rank, a trial or a data task, and so did the dashboard
head and the two agents at every start, though Ray never checks an IRI.

``lean_head`` has the raylet run this file instead of Ray's ``default_worker.py`` (same arguments),
and puts it before the script of Ray's Python head processes (``python -u lean_entry.py
.../dashboard/agent.py ...``, where Ray would put a memory profiler). It lets ``jsonschema``
register its IRI check with a stand-in that loads ``rfc3987_syntax`` on the check's first use,
takes the stand-in away so that an ``import rfc3987_syntax`` in user code gets the real module,
then runs Ray's script as ``__main__`` with the arguments and ``sys.path`` it would have had.

Run as a script: it imports nothing of ``raytrain_nb`` (a worker starts fast).
"""
from __future__ import annotations

import importlib.util
import os
import runpy
import sys
import types
from typing import Any, List

IRI_PACKAGE = "rfc3987_syntax"


def _stand_in() -> types.ModuleType:
    """A module whose ``is_valid_syntax`` imports the real package when it is first called."""
    module = types.ModuleType(IRI_PACKAGE, "loads the real package on first use (raytrain_nb lean_entry)")

    def is_valid_syntax(term: str, value: str) -> Any:
        import rfc3987_syntax  # the real one (the stand-in left sys.modules once jsonschema had this function)

        return rfc3987_syntax.is_valid_syntax(term, value)

    module.is_valid_syntax = is_valid_syntax  # type: ignore[attr-defined]
    return module


def defer_iri_grammar() -> bool:
    """Import ``jsonschema``'s format checks with the IRI grammar deferred; whether there was one to defer."""
    if IRI_PACKAGE in sys.modules or "jsonschema._format" in sys.modules:
        return False  # already paid (or never will be) in this process
    try:
        if importlib.util.find_spec(IRI_PACKAGE) is None:
            return False
    except (ImportError, ValueError):
        return False
    stand_in = _stand_in()
    sys.modules[IRI_PACKAGE] = stand_in
    try:
        import jsonschema._format  # noqa: F401 - registers its checks, ours among them
    except ImportError:
        pass
    finally:
        if sys.modules.get(IRI_PACKAGE) is stand_in:
            del sys.modules[IRI_PACKAGE]
    return True


def ray_default_worker() -> str:
    """The path of Ray's own worker script, found without importing ``ray``."""
    spec = importlib.util.find_spec("ray")
    if spec is None or not spec.submodule_search_locations:
        raise ImportError("ray is not installed in this environment")
    return os.path.join(list(spec.submodule_search_locations)[0], "_private", "workers", "default_worker.py")


def main(argv: List[str]) -> None:
    """Run the Ray script ``argv[1]`` (a ``.py`` path), or Ray's worker when the arguments start with a flag."""
    defer_iri_grammar()
    if len(argv) > 1 and argv[1].endswith(".py") and not argv[1].startswith("-"):
        script, args = argv[1], argv[2:]
    else:
        script, args = ray_default_worker(), argv[1:]
    sys.argv = [script, *args]
    if sys.path and os.path.abspath(sys.path[0] or ".") == os.path.dirname(os.path.abspath(__file__)):
        sys.path[0] = os.path.dirname(script)  # as if Ray's script ran: this package's modules must not shadow others
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main(sys.argv)
