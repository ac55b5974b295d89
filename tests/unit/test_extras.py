"""A missing optional library is named in one line with the ``pip install`` that fixes it."""
from __future__ import annotations

import sys

import pytest

from raytrain_nb._internal.extras import require


def test_an_installed_library_is_returned():
    assert require("json") is sys.modules["json"]


def test_a_missing_library_names_the_extra_to_install():
    with pytest.raises(ImportError) as info:
        require("transformers_not_here_xyz", "transformers")
    message = str(info.value)
    assert message == "transformers_not_here_xyz is not installed: pip install 'raytrain_nb[transformers]'"
    assert "\n" not in message


def test_a_known_module_finds_its_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "lightning", None)  # import lightning now raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'raytrain_nb\[lightning\]'"):
        require("lightning")
