"""The dashboard and background cells in a real Jupyter kernel (jupyter_client, no browser).

Output of a ``--background`` cell must reach that cell (by its parent header) while other cells
run; magics that cannot run meanwhile are refused with a one-line message; ``%dist_wait`` and
``--queue`` wait for it; a click that waited in the kernel's queue behind a busy cell is dropped.
"""
from __future__ import annotations


import pytest

from ..waiting import wait_for
from .nbkernel import START_TIMEOUT_S, strip_ansi, usage_error

pytestmark = pytest.mark.notebook

SETUP = """\
import time, torch, raytrain_nb as train
rank = train.get_context().get_world_rank()
x = 1
"""
LONG = """%%distributed --background
for step in range(100000):
    train.report({"step": step, "loss": 1.0 / (step + 1)})
    time.sleep(0.01)
"""
BG_REFUSED = "a background cell is running: %dist_wait waits for it, %dist_interrupt stops it"
WIDGET = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def nb(kernel):
    cell = kernel.ok(f"%%distributed --workers 2 --no-dashboard\n{SETUP}", timeout=START_TIMEOUT_S)
    assert not [d for d in cell.displays if WIDGET in d], "--no-dashboard shows no dashboard"
    kernel.ok("import raytrain_nb as _rt")
    return kernel


def _wait_running(nb, timeout=60.0):
    wait_for(lambda: nb.ok("str(_rt.active_group().state)").value == "'running'", timeout,
             "the background cell to start")


def _stop_background(nb):
    nb.ok("%dist_interrupt")
    waited = nb.run("%dist_wait", timeout=60)
    assert waited.status == "error" and "KeyboardInterrupt" in waited.error_text, waited.error_text


def test_dist_wait_without_a_background_cell_says_how_to_start_one(nb):
    assert usage_error(nb.run("%dist_wait")) == \
        "no background cell has run: start one with %%distributed --background"


def test_dist_dashboard_shows_the_widget(nb):
    cell = nb.ok("%dist_dashboard")
    assert [d for d in cell.displays if WIDGET in d], cell.describe()
    assert WIDGET in nb.ok("_rt.active_group().dashboard()").result  # group.dashboard() as a cell's value


@pytest.mark.exclusive  # a timing bound: the other test lane waits (tests/lanes.py)
def test_background_output_stays_in_its_own_cell(nb):
    bg = nb.submit("%%distributed --background\nfor i in range(12):\n"
                   "    print('tick', i, flush=True)\n    time.sleep(0.25)\n'done-value'")
    nb.finish(bg)
    assert bg.status == "ok" and "running in the background" in bg.stdout
    returned = bg.reply_t - bg.submitted
    other = nb.ok("import time\nfor j in range(6):\n    print('other', j, flush=True)\n    time.sleep(0.25)")
    assert "tick" not in other.stdout and other.stdout.count("other") == 6
    nb.ok("%dist_wait", timeout=60)
    nb.wait_for(bg, lambda m: m.type == "display_data" and "done-value" in str(m.content["data"]), timeout=30)
    assert bg.stdout.count("tick") == 12 and "other" not in bg.stdout
    ticks_during_other = [m for m in bg.streams() if "tick" in m.content["text"] and m.t > other.submitted]
    assert ticks_during_other, "the background cell kept writing into its own cell while another ran"
    assert returned < 5.0, f"--background took {returned:.1f} s to return"


def test_magics_during_a_background_cell_run_or_are_refused(nb):
    nb.ok("x = 5  # a notebook variable to push")
    nb.ok(LONG)
    _wait_running(nb)
    try:
        assert "running" in nb.ok("%dist_status").stdout
        assert "saved snapshot_" in nb.ok("%dist_checkpoint", timeout=60).stdout
        assert nb.ok("%dist_pull rank --all\nrank").value == "[0, 1]"
        for magic in ("%dist_push x", "%dist_rollback", "%dist_restart", "%dist_rescale 1", "%dist_reload os",
                      "%%distributed\nx = 2"):
            assert usage_error(nb.run(magic)).startswith(BG_REFUSED), magic
        assert usage_error(nb.run("%dist_shutdown")) == (
            "a background cell is running: %dist_interrupt stops it (or %dist_wait waits for it), then %dist_shutdown")
    finally:
        _stop_background(nb)
    assert "idle" in nb.ok("%dist_status").stdout


def test_ctrl_c_in_dist_wait_interrupts_the_background_cell(nb):
    nb.ok(LONG)
    _wait_running(nb)
    wait = nb.submit("%dist_wait")
    nb.wait_for(wait, lambda m: m.type == "stream" and "waiting for the background cell" in m.content["text"])
    nb.interrupt()
    nb.finish(wait, timeout=60)
    assert wait.status == "error" and "KeyboardInterrupt" in wait.error_text
    assert "idle" in nb.ok("%dist_status").stdout


def test_a_failed_background_cell_shows_its_error_there_and_queued_cells_do_not_run(nb):
    bg = nb.ok("%%distributed --background\ntime.sleep(1)\nraise ValueError('bad batch ' + str(rank))")
    queued = nb.run("%%distributed --queue\nprint('queued cell ran')", timeout=60)
    assert usage_error(queued).startswith("not run: the background cell it was queued behind failed (WorkerError")
    error = nb.wait_for(bg, lambda m: m.type == "error", timeout=30)
    assert "ValueError: bad batch" in strip_ansi("\n".join(error.content["traceback"]))
    waited = nb.run("%dist_wait")
    assert waited.status == "error" and "ValueError: bad batch" in waited.error_text


def test_ctrl_c_while_queued_gives_up_on_the_queued_cell_only(nb):
    nb.ok(LONG)
    _wait_running(nb)
    queued = nb.submit("%%distributed --queue\nprint('must not run')")
    nb.wait_for(queued, lambda m: m.type == "stream" and "queued behind the background cell" in m.content["text"])
    nb.interrupt()
    nb.finish(queued)
    assert usage_error(queued).startswith("interrupted while queued: this cell did not run")
    assert "must not run" not in queued.stdout
    assert nb.ok("_rt.active_group().state.value").value == "'running'"  # the background cell goes on
    _stop_background(nb)


def test_dist_dashboard_follows_raytrain_nb_ui(nb):
    nb.ok("%env RAYTRAIN_NB_UI=none")
    try:
        assert usage_error(nb.run("%dist_dashboard")) == \
            "RAYTRAIN_NB_UI=none turns the dashboard off: unset it, or use %dist_status"
        nb.ok("%env RAYTRAIN_NB_UI=fancy")
        assert usage_error(nb.run("%dist_dashboard")) == \
            "RAYTRAIN_NB_UI='fancy' is unknown: use one of auto, widgets, text, none"
        nb.ok("%env RAYTRAIN_NB_UI=text")
        text = nb.ok("%dist_dashboard")
        assert "a status line follows each report" in text.stdout and not text.displays
    finally:
        nb.ok("%env RAYTRAIN_NB_UI=auto")


def test_queue_runs_the_cell_after_the_background_cell(nb):
    nb.ok("%%distributed --background\nfor step in range(30):\n    time.sleep(0.03)\nfinal = step")
    after = nb.ok("%%distributed --queue\nprint('after', final)", timeout=60)
    assert after.stdout.splitlines()[-1] == "after 29"


def _click_message(nb, comm_id):
    return nb.kc.session.msg("comm_msg", {"comm_id": comm_id,
                                          "data": {"method": "custom", "content": {"event": "click"}}})


def test_a_click_queued_behind_a_busy_cell_is_dropped_and_a_later_one_acts(nb):
    comm_id = nb.ok("d = _rt.active_group().dashboard()\nd.buttons['checkpoint'].model_id").value.strip("'")
    before = nb.ok("len(_rt.active_group().checkpoints())").value
    busy = nb.submit("time.sleep(2)")
    nb.wait_for(busy, lambda m: m.type == "status" and m.content["execution_state"] == "busy")
    nb.kc.shell_channel.send(_click_message(nb, comm_id))  # no subshell: queued behind the busy cell
    nb.finish(busy)
    status = nb.ok("d.status.value").value
    assert "ignored a click on Checkpoint made while the kernel was busy" in status, status
    assert nb.ok("len(_rt.active_group().checkpoints())").value == before
    nb.kc.shell_channel.send(_click_message(nb, comm_id))  # the kernel is idle: it acts
    wait_for(lambda: "saved snapshot_" in nb.ok("d.status.value").value, 60, "the click on an idle kernel to act",
             interval=0.1)
    assert nb.ok("len(_rt.active_group().checkpoints())").value == str(int(before) + 1)


def test_the_first_cell_of_a_new_group_shows_the_dashboard(nb):
    nb.ok("%dist_shutdown")
    cell = nb.ok("%%distributed --workers 2\nimport raytrain_nb as train", timeout=START_TIMEOUT_S)
    assert [d for d in cell.displays if WIDGET in d], cell.describe()
    steps = nb.ok("%%distributed --steps 8\nfor step in range(4):\n    train.report({'step': step})")
    assert steps.status == "ok"
    shown = "d = _rt.active_group().dashboard()\nd.flush()\n(d.rows[0].bar.value, d.rows[0].bar.max)"
    assert nb.ok(shown).value == "(4, 8)"  # flush(): the timer thread shows it within 100 ms
    assert usage_error(nb.run("%%distributed --steps 0\npass")) == \
        "--steps 0 is not allowed: give the number of steps, at least 1"
    nb.ok("%dist_shutdown")
