"""On CPU workers ``Accelerator(fsdp_plugin=...)`` / DeepSpeed plugins are refused in one line, naming FSDP2: the
check itself, the wrap of a (stand-in) ``Accelerator``, the import hook, and the real Accelerate in a process."""
from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

from raytrain_nb import NotSupportedError
from raytrain_nb._internal.worker import accelerate_guard, cell

ROOT = Path(__file__).resolve().parents[2]


class FSDPPlugin:
    """A stand-in for Accelerate's ``FullyShardedDataParallelPlugin``."""

    def __init__(self, fsdp_version: int = 1) -> None:
        self.fsdp_version = fsdp_version


class DeepSpeedPlugin:
    """A stand-in for Accelerate's ``DeepSpeedPlugin``."""


def test_the_check_names_the_value_and_fsdp2():
    problem = accelerate_guard.cpu_sharding_problem
    fsdp = problem({"fsdp_plugin": FSDPPlugin(2)}, {})
    assert fsdp == ("Accelerator(fsdp_plugin=FSDPPlugin(fsdp_version=2)): Accelerate ignores its FSDP plugin on CPU: "
                    "shard with prepare_model(model, parallel_strategy='fsdp2') (raytrain_nb.torch), or run on GPUs "
                    "(--gpus 1, ScalingConfig(use_gpu=True))")
    assert problem({}, {"ACCELERATE_USE_FSDP": "TRUE"}).startswith("ACCELERATE_USE_FSDP=true: Accelerate ignores")
    deepspeed = problem({"deepspeed_plugin": DeepSpeedPlugin()}, {})
    assert deepspeed == ("Accelerator(deepspeed_plugin=DeepSpeedPlugin): DeepSpeed is not supported by raytrain_nb on "
                         "CPU: shard with prepare_model(model, parallel_strategy='fsdp2') (raytrain_nb.torch)")
    assert problem({"deepspeed_plugins": {"a": DeepSpeedPlugin()}}, {}).startswith(
        "Accelerator(deepspeed_plugins={'a': DeepSpeedPlugin}): DeepSpeed is not supported")
    assert problem({}, {"ACCELERATE_USE_DEEPSPEED": "true"}).startswith("ACCELERATE_USE_DEEPSPEED=true: DeepSpeed")
    for text in (fsdp, deepspeed):
        assert "\n" not in text and "parallel_strategy='fsdp2'" in text
    assert problem({"cpu": True, "fsdp_plugin": None}, {"ACCELERATE_USE_FSDP": "false", "ACCELERATE_USE_CPU": "true"}) \
        is None


def _stand_in():
    class Accelerator:
        def __init__(self, device_placement=True, deepspeed_plugin=None, fsdp_plugin=None, **kwargs):
            self.made = (fsdp_plugin, deepspeed_plugin)

    return Accelerator


@pytest.fixture
def state(monkeypatch):
    """The guard's per-process flag and the environment, restored after the test."""
    monkeypatch.setitem(accelerate_guard._STATE, "cpu", True)
    for name in ("ACCELERATE_USE_FSDP", "ACCELERATE_USE_DEEPSPEED"):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_a_guarded_accelerator_refuses_before_accelerate_runs_and_passes_the_rest(state):
    cls = _stand_in()
    accelerate_guard.guard(cls)
    wrapped = cls.__init__
    accelerate_guard.guard(cls)  # a second install wraps nothing more
    assert cls.__init__ is wrapped
    with pytest.raises(NotSupportedError, match=r"^Accelerator\(fsdp_plugin=FSDPPlugin\(fsdp_version=2\)\): "):
        cls(fsdp_plugin=FSDPPlugin(2))
    with pytest.raises(NotSupportedError, match=r"^Accelerator\(deepspeed_plugin=DeepSpeedPlugin\): "):
        cls(True, DeepSpeedPlugin())  # positionally, as the signature allows
    assert cls(True).made == (None, None)
    state.setenv("ACCELERATE_USE_FSDP", "true")
    with pytest.raises(NotSupportedError, match="^ACCELERATE_USE_FSDP=true: "):
        cls()
    state.setitem(accelerate_guard._STATE, "cpu", False)  # a GPU worker: everything passes
    plugin = FSDPPlugin(2)
    assert cls(fsdp_plugin=plugin).made == (plugin, None)


def test_the_import_hook_guards_the_module_when_it_is_first_imported(state, tmp_path):
    package = tmp_path / "rtnb_fake_accelerate"
    package.mkdir()
    (package / "__init__.py").write_text("from .accelerator import Accelerator\n")
    (package / "accelerator.py").write_text(textwrap.dedent("""
        class Accelerator:
            def __init__(self, fsdp_plugin=None):
                self.fsdp_plugin = fsdp_plugin
        """))
    state.syspath_prepend(str(tmp_path))
    state.setattr(sys, "meta_path", list(sys.meta_path))
    state.setattr(accelerate_guard, "MODULE", "rtnb_fake_accelerate.accelerator")
    for name in ("rtnb_fake_accelerate", "rtnb_fake_accelerate.accelerator"):
        state.delitem(sys.modules, name, raising=False)
    accelerate_guard.install(cpu=True)
    accelerate_guard.install(cpu=True)
    assert sum(isinstance(f, accelerate_guard.AccelerateFinder) for f in sys.meta_path) == 1
    try:
        from rtnb_fake_accelerate import Accelerator  # imported after install, through the hook

        with pytest.raises(NotSupportedError, match="Accelerate ignores its FSDP plugin on CPU"):
            Accelerator(fsdp_plugin=FSDPPlugin(2))
        assert Accelerator().fsdp_plugin is None
        module = sys.modules["rtnb_fake_accelerate.accelerator"]
        assert module.__loader__.get_filename("rtnb_fake_accelerate.accelerator").endswith("accelerator.py")
    finally:
        for name in ("rtnb_fake_accelerate", "rtnb_fake_accelerate.accelerator"):
            sys.modules.pop(name, None)


def test_install_guards_an_accelerate_already_imported_and_nothing_on_gpu(state):
    cls = _stand_in()
    state.setattr(sys, "meta_path", list(sys.meta_path))
    state.setitem(sys.modules, accelerate_guard.MODULE, types.SimpleNamespace(Accelerator=cls))
    init = cls.__init__
    accelerate_guard.install(cpu=False)
    assert cls.__init__ is init and not any(isinstance(f, accelerate_guard.AccelerateFinder) for f in sys.meta_path)
    accelerate_guard.install(cpu=True)
    assert cls.__init__ is not init
    with pytest.raises(NotSupportedError):
        cls(fsdp_plugin=FSDPPlugin())


def test_the_real_accelerate_is_refused_in_one_line_and_a_plain_accelerator_still_works():
    """In a process of its own: the hook installed before ``import accelerate``, as a worker's setup does."""
    pytest.importorskip("accelerate")
    code = textwrap.dedent("""
        from raytrain_nb._internal.worker import accelerate_guard, cell
        accelerate_guard.install(cpu=True)
        from accelerate import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin
        for make in (lambda: Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)),
                     lambda: Accelerator(deepspeed_plugin=DeepSpeedPlugin.__new__(DeepSpeedPlugin))):
            try:
                make()
            except NotImplementedError as err:
                print(type(err).__name__, err)
        import os
        assert os.environ.get("ACCELERATE_USE_FSDP") is None  # refused before Accelerate set it
        print("plain", Accelerator(cpu=True).distributed_type)
        """)
    # a fresh process as a worker starts: no Accelerate settings, and no rendezvous an earlier test of this
    # process left in its environment (Lightning run in-process sets MASTER_PORT), which a plain Accelerator joins
    rendezvous = {"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"}
    env = {k: v for k, v in os.environ.items() if not k.startswith("ACCELERATE_") and k not in rendezvous}
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          env={**env, "PYTHONPATH": str(ROOT)}, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert lines[0] == ("NotSupportedError Accelerator(fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)): "
                        "Accelerate ignores its FSDP plugin on CPU: shard with prepare_model(model, "
                        "parallel_strategy='fsdp2') (raytrain_nb.torch), or run on GPUs (--gpus 1, "
                        "ScalingConfig(use_gpu=True))")
    assert lines[1].startswith("NotSupportedError Accelerator(deepspeed_plugin=DeepSpeedPlugin): DeepSpeed is not")
    assert lines[2] == "plain DistributedType.NO"


def test_a_refusal_in_a_cell_shows_the_users_line_and_no_frame_of_ours(state):
    cls = _stand_in()
    accelerate_guard.guard(cls)
    body, tail = cell.compile_cell("x = 1\nacc = Accelerator(fsdp_plugin=FSDPPlugin(2))\n", "<cell-3>")
    with pytest.raises(NotSupportedError) as info:
        cell.run_compiled(body, tail, {"Accelerator": cls, "FSDPPlugin": FSDPPlugin})
    text = cell.format_user_traceback(info.value)
    assert 'File "<cell-3>", line 2' in text and "raytrain_nb/_internal" not in text
    assert text.count("NotSupportedError") == 1 and text.splitlines()[-1].startswith(
        "NotSupportedError: Accelerator(fsdp_plugin=FSDPPlugin(fsdp_version=2)): Accelerate ignores")
