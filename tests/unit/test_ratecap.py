"""The cap on worker text sent to a notebook cell (Jupyter Server drops floods of output)."""
from raytrain_nb.notebook.ratecap import RateCap


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_text_within_the_rate_passes_untouched():
    clock = Clock()
    cap = RateCap(rate=1000, burst=2000, clock=clock)
    for _ in range(50):
        clock.t += 0.1
        assert cap.admit("x" * 99 + "\n") == ("x" * 99 + "\n", "")
    assert cap.flush() == "" and cap.total_held_back == 0


def test_a_flood_is_cut_at_a_line_named_and_resumes_when_it_slows_down():
    clock = Clock()
    cap = RateCap(rate=1000, burst=2000, clock=clock)
    line = "y" * 99 + "\n"
    shown, notice = cap.admit(line * 30)  # 3000 characters at once: 2000 may pass
    assert shown == line * 20 and "faster than 1,000 characters/s" in notice
    shown, notice = cap.admit(line * 10)  # still flooding: held back, no second notice
    assert (shown, notice) == ("", "")
    clock.t += 2.0  # quiet for 2 s: the bucket is full again
    shown, notice = cap.admit("after\n")
    assert shown == "after\n" and notice == "[raytrain_nb: 2,000 characters of output not shown]\n"
    assert cap.total_held_back == 2000 and cap.flush() == ""


def test_what_was_held_back_at_the_end_is_named_by_flush():
    cap = RateCap(rate=10, burst=10, clock=Clock())
    shown, _ = cap.admit("0123456789abcdef\n")
    assert shown == "" and cap.flush() == "[raytrain_nb: 17 characters of output not shown]\n"


def test_rate_zero_or_the_environment_turns_it_off(monkeypatch):
    assert RateCap(rate=0).admit("z" * 10_000_000) == ("z" * 10_000_000, "")
    monkeypatch.setenv("RAYTRAIN_NB_OUTPUT_RATE", "0")
    assert RateCap().rate == 0
    monkeypatch.setenv("RAYTRAIN_NB_OUTPUT_RATE", "5000")
    assert (RateCap().rate, RateCap().burst) == (5000, 600_000)


def test_a_workers_count_of_dropped_output_is_never_held_back(capsys):
    from raytrain_nb.notebook.sink import NotebookSink

    sink = NotebookSink()
    sink._cap = RateCap(rate=10, burst=10, clock=lambda: 0.0)  # a flood: nothing more is let through
    sink.stream(0, "stdout", "x" * 50 + "\n", label=False)
    sink.stream(0, "stderr", "some text " * 5 + "\n\n[1234 characters of output dropped]\n", label=False)
    err = capsys.readouterr().err
    assert "[rank 0: 1234 characters of output dropped]" in err and "some text" not in err
