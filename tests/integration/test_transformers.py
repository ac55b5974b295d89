"""The Transformers example, ported by changing its imports, under a TorchTrainer whose rank 1 is SIGKILLed
mid-training: ``FailureConfig(max_failures=1)`` restarts it and the ``Trainer`` resumes from the newest
reported checkpoint (its model, optimizer, scheduler, trainer state and each rank's RNG state)."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import sys
from pathlib import Path

import pytest

from raytrain_nb import FailureConfig, RunConfig, ScalingConfig
from raytrain_nb.torch import TorchTrainer

from ..groups import pickled_by_value
from .test_examples import ROOT, port

pytest.importorskip("transformers")
pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def example(ray_session, tmp_path_factory):
    """examples/transformers_torch_trainer.py with its imports changed, as a module pickled by value."""
    path = tmp_path_factory.mktemp("example") / "rtnb_transformers_example.py"
    path.write_text(port((ROOT / "examples" / "transformers_torch_trainer.py").read_text()))
    spec = importlib.util.spec_from_file_location("rtnb_transformers_example", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    with pickled_by_value(module):
        yield module
    sys.modules.pop(spec.name, None)


def crashing(train_func, crash_at: int, marker: str, begins: str):
    """``train_func`` with a Trainer callback that SIGKILLs rank 1 at step ``crash_at`` once, and writes the
    step each attempt's training began from (``begins``, one JSON line per rank and attempt)."""

    def run(config):
        import transformers.trainer

        import raytrain_nb

        rank = raytrain_nb.get_context().get_world_rank()

        class CrashOnce(transformers.TrainerCallback):
            def on_train_begin(self, args, state, control, **kwargs):
                with open(begins, "a") as fh:
                    fh.write(json.dumps({"rank": rank, "step": state.global_step}) + "\n")

            def on_step_end(self, args, state, control, **kwargs):
                if rank == 1 and state.global_step == crash_at and not os.path.exists(marker):
                    open(marker, "w").close()
                    os.kill(os.getpid(), signal.SIGKILL)

        if CrashOnce.__name__ not in [c.__name__ for c in transformers.trainer.DEFAULT_CALLBACKS]:
            transformers.trainer.DEFAULT_CALLBACKS.append(CrashOnce)  # every Trainer of this process gets it
        train_func(config)

    return run


@pytest.mark.timeout(300)
def test_a_killed_worker_resumes_the_trainer_from_the_newest_checkpoint(example, tmp_path):
    begins, marker = tmp_path / "begins.jsonl", tmp_path / "crashed"
    trainer = TorchTrainer(
        crashing(example.train_func, crash_at=5, marker=str(marker), begins=str(begins)),
        train_loop_config={"output_dir": str(tmp_path / "hf"), "max_steps": 8, "save_steps": 2},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="hf-crash", storage_path=str(tmp_path / "runs"),
                             failure_config=FailureConfig(max_failures=1)),
    )
    result = trainer.fit()
    assert marker.exists(), "rank 1 never crashed"
    starts = [json.loads(line) for line in begins.read_text().splitlines()]
    # the first attempt began at step 0; the second from the checkpoint of step 4 (saved before the crash at 5)
    assert sorted((s["rank"], s["step"]) for s in starts) == [(0, 0), (0, 4), (1, 0), (1, 4)], starts
    assert result.metrics["step"] == 8 and "train_loss" in result.metrics and "eval_loss" in result.metrics
    with result.checkpoint.as_directory() as d:
        files = set(os.listdir(Path(d) / "checkpoint"))
        state = json.loads((Path(d) / "checkpoint" / "trainer_state.json").read_text())
    assert {"model.safetensors", "optimizer.pt", "scheduler.pt", "rng_state_0.pth", "rng_state_1.pth"} <= files
    assert state["global_step"] == 8
