"""Environment variables: one module declares and reads them all, and the README's table lists exactly those."""
import ast
import pathlib
import re
from typing import List

import pytest

from raytrain_nb._internal import settings

REPO = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = REPO / "raytrain_nb"
SETTINGS_PY = PACKAGE / "_internal" / "settings.py"
START = "<!-- environment variables:"
END = "<!-- end of environment variables -->"
PREFIX = "RAYTRAIN_NB_"


def _readme_rows() -> List[str]:
    text = (REPO / "README.md").read_text()
    assert START in text and END in text, "README.md has no table of environment variables between its markers"
    block = text[text.index(START):text.index(END)]
    return [line for line in block.splitlines()[1:] if line.startswith("| `")]


def expected_rows() -> List[str]:
    return [f"| `{s.name}` | {s.documented_default()} | {s.meaning} |" for s in settings.SETTINGS]


def test_the_readme_lists_every_variable_and_no_other():
    rows = _readme_rows()
    in_readme = [re.match(r"\| `([A-Z0-9_]+)`", row).group(1) for row in rows]
    declared = [s.name for s in settings.SETTINGS]
    assert set(in_readme) - set(declared) == set(), "in README.md but not in settings.py"
    assert set(declared) - set(in_readme) == set(), "in settings.py but not in README.md"
    assert rows == expected_rows(), "README.md's table differs from settings.py; it should read:\n" + \
        "\n".join(expected_rows())


def test_every_setting_is_declared_once_and_in_the_table():
    names = [s.name for s in settings.SETTINGS]
    assert len(names) == len(set(names)) and all(n.startswith(PREFIX) for n in names)
    module_settings = {v.name for v in vars(settings).values() if isinstance(v, settings.Setting)}
    assert module_settings == set(names), "a Setting of settings.py is missing from SETTINGS"
    for s in settings.SETTINGS:
        assert s.type in ("bool", "int", "float", "str") and s.meaning and "\n" not in s.meaning
        assert (s.default is None) == bool(s.when_unset), f"{s.name}: a fixed default or a when_unset, not both"


def _direct_reads(tree: ast.Module) -> List[str]:
    """Lines naming one of our variables outside settings.py: an exact ``RAYTRAIN_NB_*`` string (an environment
    key; prose in messages and docstrings is longer), or an f-string key starting with it."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and re.fullmatch(PREFIX + r"[A-Z0-9_]+", node.value):
            found.append(f"{node.lineno} {node.value!r}")
        elif isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                and str(node.values[0].value).startswith(PREFIX) and " " not in str(node.values[0].value):
            found.append(f"{node.lineno} {ast.unparse(node)}")
    return found


def test_no_module_but_settings_reads_a_variable_of_ours():
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        if path != SETTINGS_PY:
            found += [f"{path.relative_to(REPO)}:{hit}" for hit in _direct_reads(ast.parse(path.read_text()))]
    assert not found, "read RAYTRAIN_NB_* variables through raytrain_nb/_internal/settings.py:\n" + "\n".join(found)


def test_the_direct_read_check_can_fail():
    planted = ast.parse(f"import os\nx = os.environ.get('{PREFIX}FOO', '1')\ny = os.getenv(f'{PREFIX}{{k}}')\n"
                        f"z = 'set {PREFIX}FOO=1 to change it'\n")
    assert [hit.split()[0] for hit in _direct_reads(planted)] == ["2", "3"]


def test_readers_keep_each_variables_rules(monkeypatch):
    for s in settings.SETTINGS:
        monkeypatch.delenv(s.name, raising=False)
    assert (settings.dashboard(), settings.lean_entry(), settings.working_dir()) == (False, True, True)
    assert (settings.elastic_wait_s(), settings.resource_wait_s()) == (10.0, 120.0)
    assert (settings.memory_bytes(), settings.num_cpus(), settings.num_gpus()) == (None, None, None)
    assert settings.object_store_bytes() == 0 and settings.output_rate() == settings.DEFAULT_OUTPUT_RATE == 300_000
    assert settings.storage_path() is None and settings.ui() == "auto"
    told = {"DASHBOARD": "1", "LEAN_ENTRY": "0", "WORKING_DIR": "0", "ELASTIC_WAIT_S": "3", "RESOURCE_WAIT_S": "7.5",
            "MEMORY_BYTES": "2e9", "NUM_CPUS": "0", "NUM_GPUS": "2", "OBJECT_STORE_BYTES": "1000",
            "OUTPUT_RATE": "0", "STORAGE_PATH": "  s3://b/r ", "UI": " Text "}
    for key, value in told.items():
        monkeypatch.setenv(PREFIX + key, value)  # read at call time: set after import
    assert (settings.dashboard(), settings.lean_entry(), settings.working_dir()) == (True, False, False)
    assert (settings.elastic_wait_s(), settings.resource_wait_s()) == (3.0, 7.5)
    assert (settings.memory_bytes(), settings.num_cpus(), settings.num_gpus()) == (2_000_000_000, 0.0, 2.0)
    assert settings.object_store_bytes() == 1000 and settings.output_rate() == 0
    assert settings.storage_path() == "s3://b/r" and settings.ui() == "text"
    for key, value in {"DASHBOARD": "yes", "LEAN_ENTRY": "", "WORKING_DIR": "no", "MEMORY_BYTES": "", "NUM_CPUS": "",
                       "OUTPUT_RATE": "fast", "STORAGE_PATH": "  ", "UI": ""}.items():
        monkeypatch.setenv(PREFIX + key, value)
    assert (settings.dashboard(), settings.lean_entry(), settings.working_dir()) == (False, True, True)
    assert (settings.memory_bytes(), settings.num_cpus()) == (None, None)
    assert settings.output_rate() == 300_000 and settings.storage_path() is None and settings.ui() == "auto"
    monkeypatch.setenv(PREFIX + "ELASTIC_WAIT_S", "soon")
    with pytest.raises(ValueError):
        settings.elastic_wait_s()
