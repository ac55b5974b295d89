"""The cells the soak sends to the workers: setup styles (how users write their model cells) and
training, background, interrupt and error cells built from them.

Every training cell calls ``soak_note`` on rank 0 before each ``report()``: the ledger then holds
the exact state each reported checkpoint, and each snapshot taken at a report, must contain.
"""
from __future__ import annotations

import dataclasses
import os
import textwrap
from typing import Dict, Optional

#: What rank 0 prints once the ranks are inside a loop or a collective (the fault waits for it).
MARK_LOOP = "soak-in-loop"
MARK_COLLECTIVE = "soak-in-collective"

_SEQ = "torch.nn.Sequential(torch.nn.Linear({i}, {w}), torch.nn.Tanh(), torch.nn.Linear({w}, {o}))"


@dataclasses.dataclass(frozen=True)
class Style:
    """One way of writing the model cells.

    Attributes:
        name: short name used in step tokens.
        doc: what a user would have written.
        define: a setup cell run once before the first build ("" when none).
        build: code that (re)builds the model(s) and optimizer(s) under the same names; ``{w}`` is the width.
        trains_in_build: the build runs in the cell that also trains (so it is a training cell).
        step: one training step; binds ``loss``.
        forward: a forward pass only (binds ``loss``), for cells that block in the backward's collective.
        sharded: the model is sharded (FSDP2): every rank joins the gathers of its full state before a report.
    """

    name: str
    doc: str
    define: str
    build: str
    trains_in_build: bool
    step: str
    forward: str
    sharded: bool = False


def _model(i: int, o: int) -> str:
    return _SEQ.format(i=i, o=o, w="{w}")


STYLES: Dict[str, Style] = {s.name: s for s in (
    Style("fn", "model built in a function defined in one cell and called from a later cell",
          define=("def build(width):\n    global model, opt\n"
                  f"    model = prepare_model({_SEQ.format(i=16, o=1, w='width')})\n"
                  "    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)\n"),
          build="build({w})", trains_in_build=False,
          step="loss = model(torch.randn(16, 16)).pow(2).mean()\nopt.zero_grad(); loss.backward(); opt.step()",
          forward="loss = model(torch.randn(16, 16)).pow(2).mean()"),
    Style("inline", "model built in the cell that also trains it", define="",
          build=(f"model = prepare_model({_model(16, 1)})\n"
                 "opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)"),
          trains_in_build=True,
          step="loss = model(torch.randn(16, 16)).pow(2).mean()\nopt.zero_grad(); loss.backward(); opt.step()",
          forward="loss = model(torch.randn(16, 16)).pow(2).mean()"),
    Style("dict", "model and optimizer held in dicts", define="",
          build=(f"nets = {{'model': prepare_model({_model(16, 1)})}}\n"
                 "opts = {'model': torch.optim.Adam(nets['model'].parameters(), lr=1e-3)}"),
          trains_in_build=False,
          step=("loss = nets['model'](torch.randn(16, 16)).pow(2).mean()\n"
                "opts['model'].zero_grad(); loss.backward(); opts['model'].step()"),
          forward="loss = nets['model'](torch.randn(16, 16)).pow(2).mean()"),
    Style("attr", "model and optimizer held as attributes of an object", define="class Box:\n    pass\n",
          build=(f"box = Box()\nbox.model = prepare_model({_model(16, 1)})\n"
                 "box.opt = torch.optim.SGD(box.model.parameters(), lr=0.01, momentum=0.9)"),
          trains_in_build=False,
          step=("loss = box.model(torch.randn(16, 16)).pow(2).mean()\n"
                "box.opt.zero_grad(); loss.backward(); box.opt.step()"),
          forward="loss = box.model(torch.randn(16, 16)).pow(2).mean()"),
    Style("gan", "two models and two optimizers (GAN-style)", define="",
          build=(f"G = prepare_model({_model(8, 4)})\nD = prepare_model({_model(4, 1)})\n"
                 "optG = torch.optim.Adam(G.parameters(), lr=1e-3)\n"
                 "optD = torch.optim.SGD(D.parameters(), lr=0.01, momentum=0.5)\n"
                 "bce = torch.nn.BCEWithLogitsLoss()"),
          trains_in_build=False,
          step=("z = torch.randn(16, 8); real = torch.randn(16, 4) + 2\n"
                "with torch.no_grad():\n    fake = G(z)\n"
                "lossD = bce(D(torch.cat([real, fake])), torch.cat([torch.ones(16, 1), torch.zeros(16, 1)]))\n"
                "optD.zero_grad(); lossD.backward(); optD.step()\n"
                "loss = bce(D(G(z)), torch.ones(16, 1))\n"
                "optG.zero_grad(); loss.backward(); optG.step()"),
          forward="loss = bce(D(G(torch.randn(16, 8))), torch.ones(16, 1))"),
    Style("fsdp2", "a model sharded over the ranks (FSDP2), built in a cell that does not train", define="",
          build=(f"model = prepare_model({_model(16, 1)}, parallel_strategy='fsdp2')\n"
                 "opt = torch.optim.AdamW(model.parameters(), lr=1e-3)"),
          trains_in_build=False,
          step="loss = model(torch.randn(16, 16)).pow(2).mean()\nopt.zero_grad(); loss.backward(); opt.step()",
          forward="loss = model(torch.randn(16, 16)).pow(2).mean()", sharded=True),
)}

#: The styles a soak draws from by default (``--styles`` picks others), the sharded one among them.
DEFAULT_STYLES = ("fn", "inline", "dict", "attr", "gan", "fsdp2")


def prelude(ballast_mb: float) -> str:
    """The first setup cell: imports, the step counter, and a big tracked module that is never trained
    (so that a snapshot takes long enough to be interrupted by a fault)."""
    side = int((max(ballast_mb, 0.0) * 1e6 / 4) ** 0.5)
    lines = ["import json, os, shutil, tempfile, time", "import torch", "import raytrain_nb as train",
             "from raytrain_nb.torch import prepare_model", "torch.manual_seed(0)",
             "rank = train.get_context().get_world_rank()", "step = 0"]
    if side > 0:
        lines.append(f"ballast = torch.nn.Linear({side}, {side})")
    return "\n".join(lines) + "\n"


def helpers(ledger_path: str) -> str:
    """A setup cell defining the ``soak_*`` functions of :mod:`digest` on every rank."""
    here = os.path.join(os.path.dirname(os.path.abspath(__file__)), "digest.py")
    with open(here) as fh:
        source = fh.read()
    return source.replace('SOAK_LEDGER = ""', f"SOAK_LEDGER = {ledger_path!r}", 1)


def _indent(code: str, n: int = 4) -> str:
    return textwrap.indent(code, " " * n)


def _report(mode: str, tag: str, gather: bool = False) -> str:
    """The end of one step: nothing, a report, or a report with a checkpoint of every state dict. With ``gather``
    (a sharded model) every rank joins the gathers of the full state and rank 0 alone notes and saves it."""
    if mode == "none":
        return ""
    kind = "ckpt" if mode == "ckpt" else "report"
    if gather:
        note = (f"_dg = soak_note({kind!r}, {tag!r}, step, globals(), gather=True, "
                "write=train.get_context().get_world_rank() == 0)\n")
        state = "_st = soak_state(globals(), gather=True)\n"
    else:
        note = f"_dg = soak_note({kind!r}, {tag!r}, step, globals()) " \
               "if train.get_context().get_world_rank() == 0 else None\n"
        state = ""
    metrics = '{"step": step, "loss": float(loss)}'
    if mode == "report":
        return note + f"train.report({metrics})\n"
    return note + state + (
        "if train.get_context().get_world_rank() == 0:\n"
        "    _d = tempfile.mkdtemp(prefix='soak-ck-')\n"
        f"    torch.save({'_st' if gather else 'soak_state(globals())'}, os.path.join(_d, 'state.pt'))\n"
        f"    json.dump({{'tag': {tag!r}, 'step': step, 'digests': _dg}}, open(os.path.join(_d, 'soak.json'), 'w'))\n"
        f"    train.report({metrics}, checkpoint=train.Checkpoint.from_directory(_d))\n"
        "    shutil.rmtree(_d, ignore_errors=True)\n"
        "else:\n"
        f"    train.report({metrics})\n")


def training(style: Style, steps: Optional[int], mode: str, tag: str, sleep_s: float = 0.0,
             build_width: Optional[int] = None) -> str:
    """A training cell: ``steps`` steps (None: forever, for interrupts), reporting per ``mode``
    (``none``, ``report`` or ``ckpt``). Rank 0 prints :data:`MARK_LOOP` after the first step.
    With ``build_width`` the cell first (re)builds the model (the ``inline`` style)."""
    body = style.step + "\nstep += 1\n" + _report(mode, tag, style.sharded)
    body += f"if _i == 0:\n    print({MARK_LOOP!r}, flush=True)\n"
    if sleep_s:
        body += f"time.sleep({sleep_s:g})\n"
    loop = "_i = 0\nwhile True:\n" if steps is None else f"for _i in range({steps}):\n"
    if steps is None:
        body += "_i += 1\n"
    head = build_code(style, build_width) + "\n" if build_width is not None else ""
    return head + loop + _indent(body) + "float(loss)\n"


def build_code(style: Style, width: int) -> str:
    """The style's build code at this width."""
    return style.build.replace("{w}", str(width))


def blocked_in_collective(style: Style, action: str) -> str:
    """Rank 0 (and every rank but the last) waits in the backward's all_reduce while the last rank
    spins (``action="spin"``), sleeps in a loop (``"sleep"``) or raises (``"raise"``)."""
    last = {"spin": "    while True:\n        pass\n",
            "sleep": "    while True:\n        time.sleep(0.01)\n",
            "raise": "    raise ValueError('soak: an error on one rank only')\n"}[action]
    return (style.forward + "\n"
            "_ctx = train.get_context()\n"
            f"print({MARK_COLLECTIVE!r}, flush=True)\n"
            "if _ctx.get_world_size() > 1 and _ctx.get_world_rank() == _ctx.get_world_size() - 1:\n"
            + last + "loss.backward()\n")
