"""The metrics plot without a front end: what it draws, and when it redraws the slow parts."""
from raytrain_nb.notebook.dashboard.model import Line
from raytrain_nb.notebook.dashboard.plot import MetricsPlot


def _ydata(plot, label):
    return list(plot._lines[label].get_ydata())


def test_log_scale_drops_non_positive_points_and_linear_keeps_them():
    plot = MetricsPlot()
    line = Line("rank 0", [0, 1, 2, 3], [1.0, 0.0, -2.0, 0.5])
    png = plot.render([line], "loss", log=True)
    assert png.startswith(b"\x89PNG")
    assert plot.axes.get_yscale() == "log" and _ydata(plot, "rank 0") == [1.0, 0.5]
    plot.render([line], "loss", log=False)
    assert plot.axes.get_yscale() == "linear" and _ydata(plot, "rank 0") == [1.0, 0.0, -2.0, 0.5]


def test_axes_are_labelled_and_drawn_again_only_when_data_leave_them():
    plot = MetricsPlot()
    plot.render([Line("rank 0", [0, 1], [2.0, 1.9]), Line("rank 1", [0, 1], [2.1, 1.8])], "loss")
    assert (plot.axes.get_xlabel(), plot.axes.get_ylabel()) == ("step", "loss")
    assert [t.get_text() for t in plot.axes.get_legend().get_texts()] == ["rank 0", "rank 1"]
    draws = plot.full_draws
    plot.render([Line("rank 0", [0, 1, 2], [2.0, 1.9, 1.85]), Line("rank 1", [0, 1, 2], [2.1, 1.8, 1.9])], "loss")
    assert plot.full_draws == draws  # inside the limits: only the lines were drawn
    plot.render([Line("rank 0", [0, 500], [2.0, 1.0]), Line("rank 1", [0, 500], [2.1, 1.0])], "loss")
    assert plot.full_draws == draws + 1 and plot.axes.get_xlim()[1] >= 500


def test_no_metrics_yet_says_how_to_report_them():
    plot = MetricsPlot()
    plot.render([], None)
    assert "raytrain_nb.report" in plot.axes.get_title()
