"""Ray Tune around raytrain_nb, mirroring ``ray.tune.integration.ray_train`` (``ray.tune`` itself is used unchanged)."""
from __future__ import annotations

__all__: list = []

# Sweeps that start warm (issue 16, part 3): a group's snapshot starts every trial; the winner loads back.
from ._internal.tune.warm import load_state, save_state, warm_start  # noqa: E402

__all__ += ["load_state", "save_state", "warm_start"]

from ._internal.tune.report import TuneReportCallback  # noqa: E402

__all__ += ["TuneReportCallback"]

# The sweep as a widget (issue 16, part 2): rows, curves and a Stop button per trial; text in a terminal.
from .notebook.sweep import SweepDashboard  # noqa: E402

__all__ += ["SweepDashboard"]
