import json
import subprocess
import sys


def loaded_after(imports: str, modules: tuple) -> list:
    """Which of ``modules`` a fresh interpreter has loaded after ``import <imports>``."""
    code = f"import json, sys, {imports}\nprint(json.dumps(sorted(m for m in {modules!r} if m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def test_import_does_not_pull_torch_or_ray():
    assert loaded_after("raytrain_nb\nfrom raytrain_nb import report, get_context",
                        ("torch", "ray", "IPython", "ipywidgets")) == []


def test_core_never_imports_notebook_packages():
    assert loaded_after("raytrain_nb._internal.group.group, raytrain_nb._internal.worker.actor, "
                        "raytrain_nb._internal.group.dispatch", ("IPython", "ipywidgets")) == []


def test_worker_api_outside_a_worker_says_where_it_works():
    import pytest

    import raytrain_nb

    with pytest.raises(RuntimeError, match=r"report\(\) works only on a worker"):
        raytrain_nb.report({"loss": 1.0})
    with pytest.raises(RuntimeError, match=r"get_context\(\) works only on a worker"):
        raytrain_nb.get_context()


def test_the_magics_and_the_group_leave_torch_to_the_workers():
    # %load_ext raytrain_nb and a group's driver side: a kernel that trains nothing itself never loads torch (about
    # 150 MB of a 2 GB Binder pod)
    assert loaded_after("raytrain_nb.notebook.magics, raytrain_nb._internal.group.group, "
                        "raytrain_nb._internal.group.formation, raytrain_nb._internal.worker.actor", ("torch",)) == []
