"""``setup_mlflow`` / ``setup_wandb`` on the workers, as Ray's: rank 0 gets the library, the other ranks a no-op."""
from __future__ import annotations

import pytest

from tests.groups import quiet, set_up_group

pytestmark = pytest.mark.ray

MLFLOW_CELL = """
from raytrain_nb.integrations.mlflow import setup_mlflow
mlflow = setup_mlflow({"lr": 0.1, "opt": {"name": "sgd"}}, tracking_uri=server, experiment_name="setup",
                      create_experiment_if_not_exists=True)
for step in range(3):
    mlflow.log_metric("loss", 1.0 / (step + 1), step=step)  # the user's own steps, where the user calls it
run_id = mlflow.active_run().info.run_id if type(mlflow).__name__ == "module" else None
mlflow.end_run()
kind = type(mlflow).__name__
"""

WANDB_CELL = """
from raytrain_nb.integrations.wandb import setup_wandb
run = setup_wandb({"lr": 0.1}, project="setup", mode="offline", dir=folder)
run.log({"loss": 0.5}, step=1)
disabled = bool(run.disabled)
run.finish()
"""


def test_setup_mlflow_gives_rank0_mlflow_and_the_others_a_noop(ray_session, mlflow_server):
    from mlflow import MlflowClient

    with set_up_group("import raytrain_nb as train") as group:
        group.push(server=mlflow_server)
        quiet(group, MLFLOW_CELL)
        assert group.pull("kind", rank=None) == ["module", "NoopModule"]
        run_ids = group.pull("run_id", rank=None)
    assert run_ids[1] is None
    client = MlflowClient(mlflow_server)
    run = client.get_run(run_ids[0])
    assert run.data.params == {"lr": "0.1", "opt/name": "sgd"} and run.data.tags["mlflow.runName"] == "setup"  # as Ray: the experiment's name
    assert [m.step for m in client.get_metric_history(run_ids[0], "loss")] == [0, 1, 2]


def test_setup_wandb_gives_rank0_a_run_and_the_others_a_disabled_one(ray_session, tmp_path, wandb_offline):
    from .wandb_files import read_segments

    with set_up_group("import raytrain_nb as train") as group:
        group.push(folder=str(tmp_path))
        quiet(group, WANDB_CELL)
        assert group.pull("disabled", rank=None) == [False, True]
    (segment,) = read_segments(tmp_path)  # rank 0's only
    assert segment.history == [dict(segment.history[0], loss=0.5, _step=1)] and segment.config["lr"] == 0.1


@pytest.mark.parametrize("ours, theirs", [
    ("raytrain_nb.integrations.mlflow:setup_mlflow", "ray.air.integrations.mlflow:setup_mlflow"),
    ("raytrain_nb.integrations.mlflow:MLflowLoggerCallback", "ray.air.integrations.mlflow:MLflowLoggerCallback"),
    ("raytrain_nb.integrations.wandb:setup_wandb", "ray.air.integrations.wandb:setup_wandb"),
    ("raytrain_nb.integrations.wandb:WandbLoggerCallback", "ray.air.integrations.wandb:WandbLoggerCallback"),
])
def test_the_signatures_are_rays(ours, theirs):
    """Names, kinds and defaults of every parameter, as Ray 2.60 has them (annotations left out)."""
    import importlib
    import inspect

    def params(spec):
        module, name = spec.split(":")
        obj = getattr(importlib.import_module(module), name)
        return [(p.name, p.kind, p.default) for p in inspect.signature(obj).parameters.values()]

    assert params(ours) == params(theirs)
