import subprocess
import sys


def test_import_does_not_pull_torch_or_ray():
    code = ("import sys, raytrain_nb\n"
            "from raytrain_nb import report, get_context\n"
            "print(sorted(m for m in ('torch', 'ray', 'IPython', 'ipywidgets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_core_never_imports_notebook_packages():
    code = ("import sys, raytrain_nb._internal.group.group, raytrain_nb._internal.worker.actor, raytrain_nb._internal.group.dispatch\n"
            "print(sorted(m for m in ('IPython', 'ipywidgets') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


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
    code = ("import sys, raytrain_nb.notebook.magics, raytrain_nb._internal.group.group, "
            "raytrain_nb._internal.group.formation, raytrain_nb._internal.worker.actor\n"
            "print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"
