"""The dashboard in a real browser: JupyterLab + Debian's Chromium through Playwright.

One scenario, as a user would click it: train in a ``--background`` cell, watch the bars move,
click Checkpoint, click it again while another cell keeps the kernel busy, kill a worker from another
cell, see its row turn red, click Restart, see it turn back, click Rollback, and check that the
buttons are off during a foreground cell; Where shows every rank's stack during the background
cell, and ``breakpoint()`` on rank 1 takes pdb commands from JupyterLab's input box.

Since JupyterLab 4.4, widget messages go to a kernel subshell (setting "Kernel Comms over
subshells", on by default) when the kernel has them (ipykernel 7): a click is handled at once even
while a cell runs. Front ends without that queue the click until the cell ends; the dashboard
then drops it (tests/notebook/test_nb_dashboard.py sends such a click through a real kernel). Screenshots go to ``artifacts/e2e/``.

Skipped when Chromium or the Python packages are missing, except under CI (``CI=true``), where
it fails instead: ``.ci/run`` also refuses a run in which it was skipped.
"""
from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from .lab import CHROMIUM, CHROMIUM_ARGS, LabServer, require

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]  # ~60-90 s; minutes on a loaded machine

ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts" / "e2e"
STEP_TIMEOUT_MS = 90_000
START_TIMEOUT_MS = 300_000  # a loaded 2-core machine can take minutes to start Ray

CELLS = [
    "%load_ext raytrain_nb",
    """%%distributed --workers 2
import time, torch, raytrain_nb as train
from raytrain_nb.torch import prepare_model
torch.manual_seed(0)
model = prepare_model(torch.nn.Linear(8, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.004)
_ = torch.manual_seed(train.get_context().get_world_rank())  # each rank its own data""",
    """%%distributed --background --steps 3000
for step in range(3000):
    x = torch.randn(16, 8)
    loss = (model(x) - x.sum(1, keepdim=True) - 0.3 * torch.randn(16, 1)).pow(2).mean()
    opt.zero_grad(); loss.backward(); opt.step()
    if step % 25 == 0:
        print(f"train step {step} loss {loss.item():.3f}", flush=True)
    train.report({"step": step, "loss": loss.item()})
    time.sleep(0.02)""",
    "import time\ntime.sleep(5)  # the kernel is busy: a click now acts at once, or never",
    """import os, signal, raytrain_nb
victim = raytrain_nb.active_group().status()[1]
os.kill(victim.pid, signal.SIGKILL)
print("killed rank 1, pid", victim.pid)""",
    "%%distributed\ntime.sleep(4)  # a foreground cell: the buttons are off meanwhile",
    """%%distributed
if train.get_context().get_world_rank() == 1:
    breakpoint()  # pdb on rank 1, its prompt in this cell
answer = 6 * 7""",
]


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    require()
    root = tmp_path_factory.mktemp("lab") / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "dashboard.ipynb")
    env = {"RAYTRAIN_NB_NUM_CPUS": "8", "OMP_NUM_THREADS": "1",
           "RAYTRAIN_NB_STORAGE_PATH": str(root.parent / "runs")}
    server = LabServer(root, env)
    try:
        server.start_kernel("dashboard.ipynb")  # the page joins it: no "Select Kernel" dialog
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()


@pytest.fixture(scope="module")
def page(lab):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        context = browser.new_context(viewport={"width": 1500, "height": 1300})
        page = context.new_page()
        page.set_default_timeout(STEP_TIMEOUT_MS)
        yield page
        if not _passed:  # what the page looked like when it failed
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "failure.png"))
        browser.close()


def _shot(page, name: str) -> None:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    dash = page.locator(".rtnb-dashboard").first
    dash.scroll_into_view_if_needed()
    dash.screenshot(path=str(ARTIFACTS / f"{name}.png"))


def _run_cell(page, index: int) -> None:
    """Put the cursor in cell ``index`` and run it (Ctrl+Enter), as a user would."""
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+Enter")


def _width(page, rank: int) -> float:
    style = page.locator(f".rtnb-rank-{rank} .progress-bar").get_attribute("style") or ""
    match = re.search(r"width:\s*([\d.]+)%", style)
    return float(match.group(1)) if match else 0.0


def _options(page) -> int:
    return page.locator(".rtnb-checkpoints select option").count()


_passed = False


def test_dashboard_in_jupyterlab(lab, page):
    global _passed
    from playwright.sync_api import expect

    expect.set_options(timeout=STEP_TIMEOUT_MS)
    page.goto(lab.url("dashboard.ipynb"))
    expect(page.locator(".jp-Notebook .jp-Cell")).to_have_count(len(CELLS))
    expect(page.locator(".jp-Toolbar-kernelName").first).to_contain_text("Python 3")
    expect(page.locator(".jp-StatusBar-TextItem", has_text="Idle").first).to_be_visible()

    for index in (0, 1, 2):  # load, start the group (the dashboard appears), train in the background
        _run_cell(page, index)
    dash = page.locator(".rtnb-dashboard").first
    expect(dash).to_be_visible(timeout=START_TIMEOUT_MS)  # Ray and the workers start first
    expect(page.locator(".rtnb-rank-1.rtnb-state-running")).to_be_visible()

    # the progress bars move
    page.wait_for_function("""() => {
        const bar = document.querySelector('.rtnb-rank-0 .progress-bar');
        const m = bar && /width:\\s*([\\d.]+)%/.exec(bar.getAttribute('style') || '');
        return m && parseFloat(m[1]) > 0.5;
    }""")
    first = _width(page, 0)
    page.wait_for_function(f"""() => {{
        const m = /width:\\s*([\\d.]+)%/.exec(document.querySelector('.rtnb-rank-0 .progress-bar').getAttribute('style'));
        return parseFloat(m[1]) > {first};
    }}""")
    expect(page.locator(".rtnb-plot")).to_be_visible()
    _shot(page, "1-training")

    # Checkpoint during the background cell: taken at the next report(), then listed
    page.locator(".rtnb-btn-checkpoint").click()
    expect(page.locator(".rtnb-checkpoints select option")).to_have_count(1)
    expect(page.locator(".rtnb-status")).to_contain_text("saved snapshot")

    # a click while the kernel is busy with another cell: JupyterLab sends widget messages to a
    # kernel subshell, so the click acts at once, during that cell (never queued to act after it)
    prompt = page.locator(".jp-Notebook .jp-Cell").nth(3).locator(".jp-InputPrompt")
    _run_cell(page, 3)
    expect(prompt).to_contain_text("*")
    page.locator(".rtnb-btn-checkpoint").click()
    expect(page.locator(".rtnb-checkpoints select option")).to_have_count(2)
    assert "*" in prompt.inner_text(), "the snapshot came after the busy cell, not during it"
    expect(prompt).to_have_text(re.compile(r"\[\d+\]"))  # the busy cell ends; nothing else happens
    assert _options(page) == 2

    # the output of the background cell stays in its own output area
    bg_output = page.locator(".jp-Notebook .jp-Cell").nth(2).locator(".jp-OutputArea")
    busy_output = page.locator(".jp-Notebook .jp-Cell").nth(3).locator(".jp-OutputArea")
    expect(bg_output).to_contain_text("train step")
    assert "train step" not in busy_output.inner_text()

    # Where: every rank's stack in the background cell, at once
    page.locator(".rtnb-btn-where").click()
    where = page.locator(".rtnb-where")
    expect(where).to_contain_text(re.compile(r"ranks? [01].*cell", re.S))
    assert "idle" not in where.inner_text(), where.inner_text()

    # kill rank 1 from another cell: its row turns red with the cause, Restart is the way out
    _run_cell(page, 4)
    row = page.locator(".rtnb-rank-1.rtnb-state-dead")
    expect(row).to_be_visible()
    expect(row.locator(".rtnb-metrics")).to_contain_text("died")
    expect(page.locator(".rtnb-btn-restart")).to_be_enabled()
    expect(bg_output).to_contain_text("WorkerDiedError")
    _shot(page, "2-dead-worker")

    page.locator(".rtnb-btn-restart").click()
    expect(page.locator(".rtnb-rank-1.rtnb-state-idle")).to_be_visible()
    expect(page.locator(".rtnb-status")).to_contain_text("restarted rank(s) 1")
    expect(page.locator(".rtnb-btn-restart")).to_be_disabled()
    _shot(page, "3-restarted")

    page.locator(".rtnb-btn-rollback").click()
    expect(page.locator(".rtnb-status")).to_contain_text("rolled back to snapshot")
    _shot(page, "4-rolled-back")

    # a foreground cell: every button is off (the tooltip says why) until it ends
    _run_cell(page, 5)
    shutdown = page.locator(".rtnb-btn-shutdown")
    expect(shutdown).to_be_disabled()
    assert "foreground" in (shutdown.get_attribute("title") or "")
    _shot(page, "5-foreground-cell")
    shutdown.click(force=True)  # a disabled button sends nothing
    expect(shutdown).to_be_enabled()
    expect(page.locator(".rtnb-rank-0.rtnb-state-idle")).to_be_visible()
    assert "shut down" not in page.locator(".rtnb-status").inner_text()

    # breakpoint() on rank 1: pdb's prompt is JupyterLab's input box in the running cell
    _run_cell(page, 6)
    stdin = page.locator(".jp-Notebook .jp-Cell").nth(6).locator("input.jp-Stdin-input")
    expect(stdin).to_be_visible()
    out = page.locator(".jp-Notebook .jp-Cell").nth(6).locator(".jp-OutputArea")
    expect(out).to_contain_text("[rank 1] (Pdb)")
    stdin.fill("p 6 * 7")
    stdin.press("Enter")
    expect(out).to_contain_text("42")
    stdin = page.locator(".jp-Notebook .jp-Cell").nth(6).locator("input.jp-Stdin-input")
    expect(stdin).to_have_count(2)  # pdb asks again; the answered box stays above it
    stdin = stdin.last
    stdin.fill("c")
    stdin.press("Enter")
    expect(page.locator(".jp-Notebook .jp-Cell").nth(6).locator(".jp-InputPrompt")).to_have_text(
        re.compile(r"\[\d+\]"))
    expect(page.locator(".rtnb-rank-1.rtnb-state-idle")).to_be_visible()
    _passed = True
