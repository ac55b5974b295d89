"""Output capture's sync between cells: free when nothing is on its way, exact when something is."""
import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(r"""
    import ctypes, json, os
    from raytrain_nb._internal.worker import capture as c

    cap = c.OutputCapture()
    cap.install()
    markers = []
    write = os.write
    def counting(fd, data):
        if data == c._MARKER:
            markers.append(fd)
        return write(fd, data)
    c.os.write = counting

    def cell(body):
        buf = c.OutputBuffer()
        before = len(markers)
        cap.start(buf)
        body()
        cap.stop()
        return {"items": buf.drain(), "markers": len(markers) - before}

    libc = ctypes.CDLL(None)
    out = {
        "empty": cell(lambda: None),
        "python": cell(lambda: print("py")),
        "c_buffered": cell(lambda: libc.printf(b"c-no-newline")),  # in stdio's buffer until the sync's fflush
        "fd_large": cell(lambda: write(1, b"y" * 300_000)),  # more than a pipe holds: read while written
        "marker_prefix": cell(lambda: write(2, b"tail" + c._MARKER[:4])),  # held back as maybe a marker
        "after": cell(lambda: None),
    }
    write(cap._readers[0].saved, (json.dumps(out) + "\n").encode())
""")


def _run() -> dict:
    out = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()
    return json.loads(out.stdout.decode().strip().splitlines()[-1])


def test_a_sync_goes_through_the_pipes_only_when_something_is_on_its_way():
    out = _run()
    assert out["empty"] == {"items": [], "markers": 0}  # nothing written: no marker, no wait for the readers
    assert out["python"] == {"items": [["stdout", "py\n"]], "markers": 0}  # Python's writes never touch the pipe
    assert out["after"] == {"items": [], "markers": 0}
    text = "".join(t for kind, t in out["c_buffered"]["items"] if kind == "stdout")
    assert text == "c-no-newline"  # flushed by the sync, routed into the cell that wrote it
    large = "".join(t for kind, t in out["fd_large"]["items"] if kind == "stdout")
    assert large == "y" * 300_000  # every byte in its own cell, none in the next
    prefix = out["marker_prefix"]
    assert prefix["markers"] >= 1 and "".join(t for _, t in prefix["items"]) == "tail\x00\x01rt"
