"""The worker class driven directly, without Ray."""
import subprocess
import sys
import textwrap
import threading

import pytest

from raytrain_nb._internal.worker.actor import Worker

from ..waiting import wait_for


@pytest.fixture
def worker():
    return Worker(capture=False)


def test_namespace_persists_and_last_value_is_rendered(worker):
    assert worker.run_cell("x = 40", 1).failure is None
    res = worker.run_cell("x + 2", 2)
    assert res.value == ({"text/plain": "42"}, {})


def test_rich_repr_is_rendered_on_the_worker(worker):
    res = worker.run_cell("class H:\n    def _repr_html_(self):\n        return '<b>hi</b>'\nH()", 1)
    data, _ = res.value
    assert data["text/html"] == "<b>hi</b>" and "text/plain" in data


def test_failure_has_the_cells_traceback(worker):
    res = worker.run_cell("def f(a):\n    return a[3]\nf([])", 5)
    failure = res.failure
    assert failure.type_name == "IndexError"
    assert 'File "<cell-5>", line 3' in failure.traceback and "_internal" not in failure.traceback
    assert worker.run_cell("1", 6).failure is None


def test_cells_share_one_long_lived_thread(worker):
    worker.run_cell("import threading; t0 = threading.get_ident()", 1)
    res = worker.run_cell("threading.get_ident() == t0", 2)
    assert res.value[0]["text/plain"] == "True"


def _run_in_thread(worker, source):
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("res", worker.run_cell(source, 1)))
    th.start()
    return th, box


def test_interrupt_stops_python_code_and_keeps_the_namespace(worker):
    worker.run_cell("kept = 7", 0)
    th, box = _run_in_thread(worker, "n = 0\nwhile True:\n    n += 1")
    wait_for(lambda: worker.poll()["running"] is not None, 30, "the cell to start")
    out = worker.interrupt()
    th.join(5)
    assert out["state"] == "stopped"
    assert box["res"].failure.type_name == "KeyboardInterrupt" and box["res"].interrupted
    assert worker.run_cell("kept", 2).value[0]["text/plain"] == "7"


def test_interrupt_when_idle_does_nothing(worker):
    assert worker.interrupt()["state"] == "idle"
    assert worker.run_cell("1 + 1", 1).value[0]["text/plain"] == "2"


def test_interrupt_cancels_the_drivers_cell_still_waiting_behind_another_call(worker):
    """A cell that arrived while the cell thread was busy with something else (the end of a failed formation)
    has not begun when the interrupt comes: it is cancelled, and ends with KeyboardInterrupt as it would begin,
    running none of its code; the cell after it runs."""
    gate = threading.Event()
    busy = worker._cells.submit(gate.wait, 30)  # the cell thread is busy, as with a join that has not ended
    box = {}
    th = threading.Thread(target=lambda: box.setdefault("res", worker.run_cell("ran = True\nwhile True:\n    pass", 7)))
    th.start()
    wait_for(lambda: len(worker._cells._jobs) == 1, 30, "the cell to wait behind the busy call")
    assert worker.interrupt(cell_id=7)["state"] == "cancelled"
    gate.set()
    th.join(10)
    assert busy.result(5) is True and not th.is_alive()
    res = box["res"]
    assert res.failure.type_name == "KeyboardInterrupt" and res.interrupted
    assert worker.run_cell("'ran' in dir()", 8).value[0]["text/plain"] == "False"


def test_an_interrupt_for_a_cell_that_ended_or_never_came_cancels_nothing_later(worker):
    assert worker.run_cell("a = 1", 3).failure is None
    assert worker.interrupt(cell_id=3)["state"] == "idle"  # it ended before the interrupt came
    assert worker.run_cell("a + 1", 4).value[0]["text/plain"] == "2"
    assert worker.interrupt(cell_id=5)["state"] == "cancelled"  # cell 5 never came here
    assert worker.run_cell("a + 2", 6).value[0]["text/plain"] == "3"


def test_a_replayed_cell_is_never_cancelled(worker):
    """Cells a new rank replays (old ids, not sent as the driver's running cell) run whatever was cancelled."""
    assert worker.interrupt(cell_id=9)["state"] == "cancelled"
    res = worker._cells.call(worker._run_cell, "b = 5", 2, False)
    assert res.failure is None and worker.run_cell("b", 10).value[0]["text/plain"] == "5"


def test_rank_blocked_in_c_is_reported_with_its_stack(worker):
    th, box = _run_in_thread(worker, "import time\ntime.sleep(2.5)\nafter = True")
    wait_for(lambda: worker.poll()["running"] is not None, 30, "the cell to start")
    out = worker.interrupt(grace_s=0.1, release_wait_s=0.2)
    assert out["state"] == "stuck" and "time.sleep(2.5)" in out["stack"]
    th.join(10)
    assert box["res"].failure.type_name == "KeyboardInterrupt"


def test_interrupts_never_escape_into_library_code(worker):
    """Hammer short cells with interrupts: every cell either succeeds or fails with
    KeyboardInterrupt in user code; the worker never raises and keeps working."""
    stop = threading.Event()

    def hammer():
        while not stop.is_set():
            worker.interrupt(grace_s=0.0, release_wait_s=0.0)

    th = threading.Thread(target=hammer)
    th.start()
    outcomes = set()
    try:
        for i in range(300):
            res = worker.run_cell("y = sum(range(200))\ny", i)
            failure = res.failure
            outcomes.add(failure.type_name if failure else "ok")
    finally:
        stop.set()
        th.join()
    assert outcomes <= {"ok", "KeyboardInterrupt"}
    assert worker.run_cell("y", 999).value[0]["text/plain"] == "19900"


def test_push_pull_and_missing_name(worker):
    worker.push({"a": [1, 2]})
    assert worker.pull("a") == [1, 2]
    with pytest.raises(NameError, match="name 'nope' is not defined on rank -1"):
        worker.pull("nope")


def test_fd_level_output_is_captured_per_cell():
    """Python prints, os.write on fd 1/2 and C printf land in the cell that wrote them."""
    code = textwrap.dedent("""
        import ctypes, json, os
        from raytrain_nb._internal.worker.actor import Worker
        w = Worker()
        a = w.run_cell("import os, ctypes\\nprint('py')\\nos.write(1, b'fd1\\\\n')\\nos.write(2, b'fd2\\\\n')\\n"
                       "libc = ctypes.CDLL(None)\\nlibc.printf(b'c-printf\\\\n')", 1)
        b = w.run_cell("print('second')", 2)
        os.write(w._capture._readers[0].saved, (json.dumps([a.outputs, b.outputs]) + "\\n").encode())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    import json

    first, second = json.loads(out.stdout.strip().splitlines()[-1])
    text = "".join(t for kind, t in first if kind == "stdout")
    assert "py\n" in text and "fd1\n" in text and "c-printf\n" in text
    assert ["stderr", "fd2\n"] in first
    assert second == [["stdout", "second\n"]]


def test_a_cell_run_again_reuses_its_code_under_its_own_name():
    from raytrain_nb._internal.worker import cell

    source = "def f(a):\n    return a[3]\nf([])"
    first, again = cell.compile_cell(source, "<cell-1>"), cell.compile_cell(source, "<cell-2>")
    hits = cell._compiled.cache_info().hits
    assert cell.compile_cell(source, "<cell-3>") and cell._compiled.cache_info().hits == hits + 1
    (body1, tail1), (body2, tail2) = first, again
    assert body1.co_filename == tail1.co_filename == "<cell-1>"
    assert body2.co_filename == tail2.co_filename == "<cell-2>"
    nested = [c for c in body2.co_consts if hasattr(c, "co_filename")]
    assert nested and all(c.co_filename == "<cell-2>" for c in nested)  # f's frames name this cell
    worker = Worker(capture=False)
    for cell_id in (7, 8):  # the second run reuses the first one's code, and its traceback names cell 8
        tb = worker.run_cell(source, cell_id).failure.traceback
        assert f'File "<cell-{cell_id}>", line 2, in f\n    return a[3]' in tb, tb
    with pytest.raises(SyntaxError) as info:
        cell.compile_cell("x = (", "<cell-8>")
    assert info.value.filename == "<cell-8>"
