"""The sweep dashboard: a Ray Tune callback that shows a sweep's trials and stops them (widgets or text)."""
from .callback import SweepDashboard
from .stopper import DashboardStopper

__all__ = ["SweepDashboard", "DashboardStopper"]
