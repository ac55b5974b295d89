import pytest

from raytrain_nb._internal.worker import cell


def test_last_expression_value_is_returned():
    ns = {}
    body, tail = cell.compile_cell("x = 2\nx * 21", "<cell-1>")
    assert cell.run_compiled(body, tail, ns) == 42 and ns["x"] == 2


def test_statement_only_cell_returns_none():
    body, tail = cell.compile_cell("y = 1", "<cell-2>")
    assert tail is None and cell.run_compiled(body, tail, {}) is None


def test_ipython_syntax_detected_and_transformed():
    assert cell.needs_ipython("%time x = 1")
    assert cell.needs_ipython("files = !ls")
    assert not cell.needs_ipython("x = 5 % 3\ny = 'a!b'")
    code = cell.transform("!echo hi\n%time y = 1\n")
    assert "get_ipython().system" in code and "run_line_magic" in code


def test_traceback_starts_at_the_users_cell():
    src = "def f():\n    return 1 / 0\nf()\n"
    body, tail = cell.compile_cell(src, "<cell-7>")
    with pytest.raises(ZeroDivisionError) as info:
        cell.run_compiled(body, tail, {})
    text = cell.format_user_traceback(info.value)
    assert 'File "<cell-7>", line 3' in text and "return 1 / 0" in text
    assert "raytrain_nb/_internal" not in text


def test_syntax_error_carries_cell_line():
    with pytest.raises(SyntaxError) as info:
        cell.compile_cell("x = 1\ny = (\n", "<cell-9>")
    text = cell.format_user_traceback(info.value)
    assert "<cell-9>" in text and "SyntaxError" in text and "Traceback" not in text
