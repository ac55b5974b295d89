from raytrain_nb._internal.group.tables import format_status
from raytrain_nb._internal.output import CollectSink, Labeller, route


def test_labeller_prefixes_each_line_across_chunks():
    lab = Labeller()
    assert lab(1, "stdout", "a\nb") == "[rank 1] a\n[rank 1] b"
    assert lab(1, "stdout", "c\nd\n") == "c\n[rank 1] d\n"
    assert lab(1, "stdout", "e\n") == "[rank 1] e\n"
    assert lab(0, "stderr", "x\n") == "[rank 0] x\n"


def test_route_shows_only_chosen_ranks():
    sink = CollectSink()
    items = [("stdout", "hi\n"), ("display", ({"text/plain": "v"}, {}))]
    route(sink, 1, items, shown=[0], mode="rank0")
    assert sink.streams == [] and sink.displays == []
    route(sink, 0, items, shown=[0], mode="rank0")
    assert sink.text() == "hi\n" and sink.displays == [(0, {"text/plain": "v"})]
    route(sink, 0, items, shown=[0], mode="none")
    assert len(sink.streams) == 1


def test_status_table_has_a_row_per_rank():
    class Row:
        def __init__(self, rank, state):
            self.rank, self.node, self.pid, self.device, self.state = rank, "10.0.0.1", 100 + rank, "cpu", state
            self.last_metrics, self.error = {"loss": 0.123456, "step": 3}, "killed" if state == "dead" else ""
    text = format_status([Row(0, "idle"), Row(1, "dead")])
    lines = text.splitlines()
    assert lines[0].split() == ["rank", "node", "pid", "device", "state", "resources", "step", "last", "metrics"]
    assert "loss=0.1235 step=3" in lines[1] and "dead (killed)" in lines[2]
    Row.resources = {"cpu": 97.6, "rss": 3 * 2 ** 30, "mem_used": 10, "mem_limit": 100, "mem_flag": False}
    Row.step_time, Row.slow = 0.3141, True
    assert "cpu 98% · rss 3.0 GB" in format_status([Row(0, "running")]).splitlines()[1]
    assert "0.314 s/step SLOW" in format_status([Row(0, "running")])
