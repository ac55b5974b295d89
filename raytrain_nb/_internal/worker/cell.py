"""Compile and run notebook cell source with IPython semantics (worker side).

The value of a trailing expression is returned for display; tracebacks start
at the user's cell, whose lines are registered in :mod:`linecache`; IPython
syntax (``%time``, ``!cmd``, ``%pip``) is translated by IPython's own input
transformer, loaded only when the cell contains such syntax.
"""
from __future__ import annotations

import ast
import functools
import linecache
import os
import re
import traceback
from types import CodeType, TracebackType
from typing import Any, Dict, Optional, Tuple

from ..errors import CollectiveError, NotSupportedError

# A line starting with % or !, an assignment from !cmd / %magic, or a trailing ?.
_IPYTHON_SYNTAX = re.compile(r"^\s*(%|!)|^[^#'\"\n]*=\s*[%!]|\?\s*$", re.M)


def needs_ipython(source: str) -> bool:
    """Whether the source uses IPython-only syntax (magics, shell escapes)."""
    return bool(_IPYTHON_SYNTAX.search(source))


def transform(source: str) -> str:
    """Translate IPython syntax into plain Python (``get_ipython().run_line_magic``...)."""
    if not needs_ipython(source):
        return source
    from IPython.core.inputtransformer2 import TransformerManager  # IPython: only for cells that use it

    return TransformerManager().transform_cell(source)


_DEFINITIONS = (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)


def definitions(source: str) -> str:
    """Only the top-level imports, functions and classes of a cell (what a new rank takes from a cell
    that trained: the objects it made come from a live peer), other lines blanked so line numbers stay
    the cell's. Empty when the cell has none or does not parse."""
    code = transform(source)
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return ""
    lines = code.splitlines()
    keep = [False] * len(lines)
    for node in tree.body:
        if isinstance(node, _DEFINITIONS):
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            for i in range(first - 1, (node.end_lineno or node.lineno)):
                keep[i] = True
    if not any(keep):
        return ""
    return "\n".join(line if k else "" for line, k in zip(lines, keep)) + "\n"


def register_source(filename: str, source: str) -> None:
    """Make ``filename`` resolvable by linecache so tracebacks show the cell."""
    lines = source.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    linecache.cache[filename] = (len(source), None, lines, filename)


def compile_cell(source: str, filename: str) -> Tuple[Optional[CodeType], Optional[CodeType]]:
    """Compile a cell into (body, last_expression) code objects.

    A source compiled before is not compiled again (a cell run in a loop, ``%%distributed`` on the same
    code): its code objects are reused under ``filename``, so tracebacks name this cell.

    Raises:
        SyntaxError: with ``filename`` and the cell's line numbers.
    """
    register_source(filename, source)
    try:
        body, tail = _compiled(source)
    except SyntaxError:
        return _compile(source, filename)  # again, to raise it with this cell's name
    return (_renamed(body, filename) if body is not None else None,
            _renamed(tail, filename) if tail is not None else None)


_ANY_CELL = "<cell>"


@functools.lru_cache(maxsize=256)
def _compiled(source: str) -> Tuple[Optional[CodeType], Optional[CodeType]]:
    return _compile(source, _ANY_CELL)


def _compile(source: str, filename: str) -> Tuple[Optional[CodeType], Optional[CodeType]]:
    tree = ast.parse(source, filename=filename, mode="exec")
    last: Optional[ast.Expression] = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        expr = tree.body.pop()
        last = ast.Expression(expr.value)
        ast.copy_location(last, expr)
    body = compile(tree, filename, "exec") if tree.body else None
    tail = compile(last, filename, "eval") if last is not None else None
    return body, tail


def _renamed(code: CodeType, filename: str) -> CodeType:
    """``code`` and the code objects it holds (functions, classes, comprehensions) under ``filename``."""
    consts = tuple(_renamed(c, filename) if isinstance(c, CodeType) else c for c in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def run_compiled(body: Optional[CodeType], tail: Optional[CodeType], namespace: Dict[str, Any]) -> Any:
    """Execute compiled cell code in ``namespace``; return the trailing expression's value."""
    if body is not None:
        exec(body, namespace)
    if tail is not None:
        return eval(tail, namespace)
    return None


_OWN_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # raytrain_nb/_internal: worker/, train/, ...


_RAY_DIR = os.sep + "ray" + os.sep


def _is_ours(filename: str) -> bool:
    """Frames of this package's internals or of Ray's machinery (never the user's)."""
    return filename.startswith(_OWN_DIR) or (_RAY_DIR in filename and "site-packages" in filename)


def format_user_traceback(exc: BaseException) -> str:
    """Format ``exc`` from the first frame of user code on; drop our own frames.

    A syntax error is shown without a stack, like IPython does.
    """
    if isinstance(exc, SyntaxError):
        return "".join(traceback.format_exception_only(type(exc), exc)).rstrip("\n")
    frames = []
    tb: Optional[TracebackType] = exc.__traceback__
    while tb is not None:
        frames.append(tb)
        tb = tb.tb_next
    # Start at the cell's own frame; for a function, at the first frame that is not ours.
    first = next((f for f in frames if f.tb_frame.f_code.co_filename.startswith("<cell-")), None)
    if first is None:
        first = next((f for f in frames if not _is_ours(f.tb_frame.f_code.co_filename)), None)
    lines = ["Traceback (most recent call last):\n"]
    # said in one line (a collective's failure, a refusal): the stack ends at the user's call, not in ours
    if isinstance(exc, (CollectiveError, NotSupportedError)):
        shown = frames[frames.index(first):] if first is not None else []
        while shown and _is_ours(shown[-1].tb_frame.f_code.co_filename):
            shown.pop()
        lines += traceback.format_list(traceback.extract_tb(shown[0], limit=len(shown))) if shown else []
        return "".join(lines + [f"{type(exc).__name__}: {exc}"])
    lines += traceback.format_tb(first) if first is not None else []
    lines += traceback.format_exception_only(type(exc), exc)
    return "".join(lines).rstrip("\n")
