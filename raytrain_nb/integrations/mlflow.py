"""MLflow, as Ray's ``ray.air.integrations.mlflow``: ``MLflowLoggerCallback`` and ``setup_mlflow``.

``MLflowLoggerCallback`` logs a ``fit()`` (``RunConfig(callbacks=[MLflowLoggerCallback(...)])``) or a group's
cells (``group.track(MLflowLoggerCallback(...))``, ``%%distributed --track mlflow``) on the driver, in the
background: the config as parameters, every report's numbers at the run's report index (rank 0's, and
``<name>/mean`` over the ranks where they differ), committed checkpoints (a ``checkpoint.<name>`` tag with their
location; their files as artifacts with ``save_artifact=True``), and a tag and a description line for each failed
attempt, rollback and recovery. The run directory keeps the MLflow run's id (``tracking.json``), so restarts,
resumes, a trainer made again with the same ``RunConfig(name)`` and new kernels all log into that one run, and no
step is logged twice. A server that is down or slow is retried in the background and named once in a warning.

``setup_mlflow(config)`` on a worker returns ``mlflow`` on rank 0 (a run started, ``config`` logged as
parameters) and a no-op module on the other ranks (``rank_zero_only=False``: ``mlflow`` everywhere). What it
returns logs where it is called, on the step path, with the user's own steps.

Example::

    from raytrain_nb.integrations.mlflow import MLflowLoggerCallback
    trainer = TorchTrainer(loop, run_config=RunConfig(name="r1", callbacks=[
        MLflowLoggerCallback("http://127.0.0.1:5000", experiment_name="digits")]))
"""
from __future__ import annotations

from .._internal.tracking.setup import setup_mlflow as _setup_mlflow
from .._internal.train.tracking import MLflowLoggerCallback

__all__ = ["MLflowLoggerCallback", "setup_mlflow"]


def setup_mlflow(config=None, tracking_uri=None, registry_uri=None, experiment_id=None, experiment_name=None,
                 tracking_token=None, artifact_location=None, run_name=None, create_experiment_if_not_exists=False,
                 tags=None, rank_zero_only=True):
    """Set up MLflow on a worker (Ray's ``setup_mlflow``, same arguments).

    Rank 0 (or every rank with ``rank_zero_only=False``) sets the tracking and registry URIs, picks the
    experiment (``experiment_id``, else ``experiment_name``, made when ``create_experiment_if_not_exists``; else
    ``MLFLOW_EXPERIMENT_ID`` / ``MLFLOW_EXPERIMENT_NAME``, else MLflow's default), starts a run named ``run_name``
    (default: the experiment's or the run's name) unless one is active, logs ``config`` as parameters and returns
    the ``mlflow`` module; other ranks get a no-op module.

    Raises:
        ImportError: mlflow is not installed (``pip install 'raytrain_nb[mlflow]'``).
        ValueError: ``experiment_name`` does not exist and ``create_experiment_if_not_exists`` is False.
    """
    return _setup_mlflow(config, tracking_uri, registry_uri, experiment_id, experiment_name, tracking_token,
                         artifact_location, run_name, create_experiment_if_not_exists, tags, rank_zero_only)
