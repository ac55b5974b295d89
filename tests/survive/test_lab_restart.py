"""In a real browser: JupyterLab's Kernel > Restart Kernel... keeps a keep-alive group, and a cell attaches it.

The user's path: start a group with ``--keep-alive``, train a little, restart the kernel from JupyterLab's menu
(its dialog answered), then ``%dist_attach`` in a cell: the same workers, the same weights. Skipped when Chromium
or the Python packages are missing, except under CI (``CI=true``), where it fails instead.
"""
from __future__ import annotations

import json

import nbformat
import pytest

from tests.e2e.lab import CHROMIUM, CHROMIUM_ARGS, LabServer, require

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(600)]

STEP_TIMEOUT_MS = 90_000
START_TIMEOUT_MS = 300_000  # the shared instance and the workers start first; minutes on a loaded machine

CELLS = [
    "%load_ext raytrain_nb",
    """%%distributed --workers 2 --keep-alive 2m --name lab-survivor --no-dashboard
import torch
torch.manual_seed(0)
model = torch.nn.Linear(8, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
for _ in range(5):
    opt.zero_grad(); model(torch.ones(4, 8)).sum().backward(); opt.step()
before = float(model.weight.sum())
print("trained", before)""",
    "%load_ext raytrain_nb\n%dist_attach lab-survivor --no-dashboard",
    "%%distributed\nprint('same weights:', float(model.weight.sum()) == before)",
    "%dist_shutdown",
]


@pytest.fixture
def lab(tmp_path):
    require()
    root = tmp_path / "root"
    root.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(src) for src in CELLS]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, root / "survive.ipynb")
    env = {"RAYTRAIN_NB_NUM_CPUS": "8", "OMP_NUM_THREADS": "1", "RAYTRAIN_NB_STORAGE_PATH": str(tmp_path / "runs"),
           "RAYTRAIN_NB_INSTANCE_DIR": str(tmp_path / "instance")}
    server = LabServer(root, env)
    try:
        server.start_kernel("survive.ipynb")
    except BaseException:
        server.stop()
        raise
    yield server
    server.stop()
    try:  # an instance a failed run left: its supervisor ends it on SIGTERM
        import os
        import signal

        pid = json.loads((tmp_path / "instance" / "instance.json").read_text())["pid"]
        os.kill(pid, signal.SIGTERM)
    except (OSError, ValueError, KeyError):
        pass


def _run_cell(page, index: int) -> None:
    cell = page.locator(".jp-Notebook .jp-Cell").nth(index)
    cell.locator(".cm-content").click()
    page.keyboard.press("Control+Enter")


def _output(page, index: int):
    return page.locator(".jp-Notebook .jp-Cell").nth(index).locator(".jp-OutputArea")


def test_restart_from_the_menu_then_attach(lab):
    from playwright.sync_api import expect, sync_playwright

    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1400, "height": 1100}).new_page()
        page.set_default_timeout(STEP_TIMEOUT_MS)
        expect.set_options(timeout=STEP_TIMEOUT_MS)
        page.goto(lab.url("survive.ipynb"))
        expect(page.locator(".jp-Notebook .jp-Cell")).to_have_count(len(CELLS))
        expect(page.locator(".jp-StatusBar-TextItem", has_text="Idle").first).to_be_visible()

        _run_cell(page, 0)
        _run_cell(page, 1)
        expect(_output(page, 1)).to_contain_text("trained", timeout=START_TIMEOUT_MS)

        page.locator(".lm-MenuBar-itemLabel", has_text="Kernel").click()
        page.locator(".lm-Menu-itemLabel", has_text="Restart Kernel…").first.click()
        page.locator(".jp-Dialog-button.jp-mod-accept").click()  # "Restart"
        expect(page.locator(".jp-StatusBar-TextItem", has_text="Idle").first).to_be_visible()

        _run_cell(page, 2)
        expect(_output(page, 2)).to_contain_text("attached group lab-survivor (2 workers")
        _run_cell(page, 3)
        expect(_output(page, 3)).to_contain_text("same weights: True")
        _run_cell(page, 4)
        expect(_output(page, 4)).to_contain_text("shut down")
        shown = [_output(page, i).inner_text() for i in (2, 3, 4)]
        browser.close()
    assert "same weights: True" in shown[1] and not any("Traceback" in text for text in shown), shown
