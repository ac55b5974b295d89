"""lean_entry: jsonschema's IRI check registered with its grammar deferred, in a fresh interpreter each."""
from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import textwrap

import pytest

if importlib.util.find_spec("rfc3987_syntax") is None:  # found, not imported: its grammar costs a second or two
    pytest.skip("rfc3987_syntax is not installed (it comes beside JupyterLab): nothing to defer",
                allow_module_level=True)

PROBE = textwrap.dedent("""
    import json, sys
    {prelude}
    from raytrain_nb._internal.lean_entry import defer_iri_grammar
    deferred = defer_iri_grammar()
    loaded = "rfc3987_syntax" in sys.modules
    import jsonschema
    checks = jsonschema.FormatChecker()
    iri = [checks.conforms("http://example.com/\\u00fc", "iri"), checks.conforms("no iri", "iri")]
    print(json.dumps({{"deferred": deferred, "loaded_before_a_check": loaded, "iri": iri,
                      "iri_checked": "iri" in checks.checkers}}))
""")


def _probe(prelude: str = "") -> dict:
    out = subprocess.run([sys.executable, "-c", PROBE.format(prelude=prelude)], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_the_iri_grammar_waits_for_the_first_check_which_still_answers_right():
    assert _probe() == {"deferred": True, "loaded_before_a_check": False, "iri": [True, False], "iri_checked": True}


def test_a_process_that_loaded_jsonschema_already_is_left_as_it_is():
    seen = _probe("import jsonschema")
    assert seen["deferred"] is False and seen["iri"] == [True, False]


def test_without_the_package_jsonschema_has_no_iri_check_as_before():
    seen = _probe("sys.modules['rfc3987_syntax'] = None  # as if not installed")
    assert seen["deferred"] is False and seen["iri_checked"] is False  # jsonschema's own fallback: no IRI check


def test_the_demo_runner_loads_nbformat_without_building_the_grammar():
    code = ("import json, sys\nfrom raytrain_nb import demo\ndemo.load_notebook_tools()\nimport nbformat\n"
            "nbformat.validate(nbformat.v4.new_notebook())\n"
            "print(json.dumps(['nbformat' in sys.modules, 'rfc3987_syntax' in sys.modules]))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [True, False]
