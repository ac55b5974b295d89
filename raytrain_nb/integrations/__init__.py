"""Experiment tracking, as Ray's ``ray.air.integrations``: :mod:`.mlflow` and :mod:`.wandb`.

Each has a run callback (``MLflowLoggerCallback``, ``WandbLoggerCallback``) for ``RunConfig(callbacks=[...])``,
which also tracks a group (``group.track(callback)``, ``%%distributed --track mlflow``), and ``setup_mlflow`` /
``setup_wandb`` for the workers. A run logs into one tracked run whatever happens to it (restarts, resumes, new
kernels), at its report index, in the background.
"""
