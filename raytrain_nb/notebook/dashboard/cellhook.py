"""A callback after every cell of the kernel (IPython's ``post_run_cell``), and its removal: nothing outside a kernel."""
from __future__ import annotations

from typing import Any, Callable, Optional


def after_every_cell(callback: Callable[..., None]) -> Optional[Callable[[], None]]:
    """Run ``callback`` after every cell of this kernel; returns what removes it (None outside a kernel)."""
    try:
        from IPython import get_ipython  # IPython: only inside a kernel
    except ImportError:  # pragma: no cover
        return None
    shell: Any = get_ipython()
    if shell is None:
        return None
    shell.events.register("post_run_cell", callback)

    def remove() -> None:
        try:
            shell.events.unregister("post_run_cell", callback)
        except ValueError:  # already removed
            pass
    return remove
