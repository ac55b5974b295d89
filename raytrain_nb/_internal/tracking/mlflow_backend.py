"""MLflow's calls for a :class:`~.tracker.Tracker`, all made on its background thread through an ``MlflowClient``
(the process's active MLflow run and tracking URI are left as they are)."""
from __future__ import annotations

import os
import time
from typing import Any, Dict, List, Mapping, Optional, Tuple

from ..extras import require
from .background import Rejected

#: MLflow takes at most this many metrics in one request.
METRICS_PER_REQUEST = 1000
PARAMS_PER_REQUEST = 100
#: The tag MLflow's UI shows as the run's description; events are appended to it, one line each.
NOTE_TAG = "mlflow.note.content"


class MLflowBackend:
    """One MLflow run: opened or resumed by id, logged to with explicit steps.

    The arguments are ``MLflowLoggerCallback``'s (Ray's): the tracking server (default ``MLFLOW_TRACKING_URI``, else
    MLflow's local store), the experiment (created when missing; default ``MLFLOW_EXPERIMENT_ID`` /
    ``MLFLOW_EXPERIMENT_NAME``, else MLflow's default experiment), tags for a new run, a token for the server,
    and whether committed checkpoints are uploaded as artifacts (else tagged with their location).
    """

    def __init__(self, tracking_uri: Optional[str] = None, registry_uri: Optional[str] = None,
                 experiment_name: Optional[str] = None, tags: Optional[Mapping[str, Any]] = None,
                 tracking_token: Optional[str] = None, save_artifact: bool = False) -> None:
        # the environment is read once, here: the settings of a tracker are those it was made with
        self.tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        self.registry_uri = registry_uri
        self.experiment_name = experiment_name or os.environ.get("MLFLOW_EXPERIMENT_NAME")
        self.given_experiment_id = None if self.experiment_name else os.environ.get("MLFLOW_EXPERIMENT_ID")
        self.tags = {str(k): str(v) for k, v in (tags or {}).items()}
        self.tracking_token = tracking_token
        self.save_artifact = save_artifact
        self.run_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self.params: Dict[str, str] = {}
        self.notes = ""
        self._client: Any = None

    # -- naming ------------------------------------------------------------------------------------

    def describe(self) -> str:
        return f"MLflow at {self.tracking_uri or 'its default store'}"

    def state_key(self) -> str:
        """Where the run id is kept in ``tracking.json``: one tracked run per server and experiment."""
        return f"mlflow {self._uri()} {self.experiment_name or self.given_experiment_id or ''}".rstrip()

    def _uri(self) -> str:
        if self.tracking_uri is None:
            self.tracking_uri = require("mlflow").get_tracking_uri()
        return str(self.tracking_uri)

    @staticmethod
    def permanent(exc: BaseException) -> bool:
        """A 4xx answer (a bad value, a changed parameter) cannot be fixed by retrying; 408 and 429 can."""
        status = getattr(exc, "get_http_status_code", None)
        if not callable(status) or type(exc).__module__.split(".")[0] != "mlflow":
            return False
        code = status()
        return 400 <= code < 500 and code not in (408, 429)

    # -- the run -----------------------------------------------------------------------------------

    def client(self) -> Any:
        if self._client is None:
            if self.tracking_token:
                os.environ["MLFLOW_TRACKING_TOKEN"] = self.tracking_token  # as Ray's callback does
            tracking = require("mlflow.tracking", "mlflow")
            self._client = tracking.MlflowClient(tracking_uri=self._uri(), registry_uri=self.registry_uri)
        return self._client

    def _experiment(self) -> str:
        client = self.client()
        if not self.experiment_name:
            return self.given_experiment_id or "0"  # MLflow's default experiment
        found = client.get_experiment_by_name(self.experiment_name)
        return found.experiment_id if found is not None else client.create_experiment(self.experiment_name)

    def open(self, stored: Mapping[str, Any], run_name: str, run_url: str) -> None:
        """Resume the run ``stored`` names (when it still exists), else start a new one."""
        client = self.client()
        run_id = stored.get("run_id")
        run = None
        if isinstance(run_id, str) and run_id:
            try:
                run = client.get_run(run_id)
            except Exception as exc:  # noqa: BLE001 - a deleted run: start a new one; the server down: retried
                if not self.permanent(exc):
                    raise
            if run is not None and run.info.lifecycle_stage == "deleted":
                run = None
        if run is None:
            self.experiment_id = self._experiment()
            run = client.create_run(self.experiment_id, run_name=run_name,
                                    tags={**self.tags, "raytrain_nb.run_dir": run_url})
        else:
            self.experiment_id = run.info.experiment_id
            if run.info.status != "RUNNING":
                client.update_run(run.info.run_id, status="RUNNING")
            self.params = dict(run.data.params)
            self.notes = run.data.tags.get(NOTE_TAG, "")
        self.run_id = run.info.run_id

    def state_entry(self) -> Dict[str, Any]:
        return {"run_id": self.run_id, "experiment_id": self.experiment_id}

    def _run(self) -> str:
        if self.run_id is None:
            raise Rejected("the tracked run could not be opened (see the warning before)")
        return self.run_id

    # -- logging -----------------------------------------------------------------------------------

    def log_metrics(self, rows: List[Tuple[int, Dict[str, float], float]]) -> None:
        entities = require("mlflow.entities", "mlflow")
        metrics = [entities.Metric(key, value, int(when * 1000), step)
                   for step, row, when in rows for key, value in row.items()]
        run_id = self._run()
        for start in range(0, len(metrics), METRICS_PER_REQUEST):
            self.client().log_batch(run_id, metrics=metrics[start:start + METRICS_PER_REQUEST])

    def log_params(self, values: Dict[str, Any], index: int) -> None:
        """New parameters as MLflow params; one whose value changed (MLflow keeps a param fixed) as a tag."""
        entities = require("mlflow.entities", "mlflow")
        run_id = self._run()
        params = {k: str(v) for k, v in values.items()}
        new = [entities.Param(k, v) for k, v in params.items() if k not in self.params]
        when = f"; changed after report {index}" if index else ""
        changed = [entities.RunTag(f"param_changed.{k}", f"{v} (the param has {self.params[k]}{when})")
                   for k, v in params.items() if k in self.params and self.params[k] != v]
        for start in range(0, max(len(new), len(changed)), PARAMS_PER_REQUEST):
            self.client().log_batch(run_id, params=new[start:start + PARAMS_PER_REQUEST],
                                    tags=changed[start:start + PARAMS_PER_REQUEST])
        self.params.update({p.key: p.value for p in new})

    def log_checkpoint(self, index: int, name: str, url: str, local_path: Optional[str]) -> None:
        """Tag the checkpoint's location; with ``save_artifact``, upload its files too (local storage)."""
        run_id = self._run()
        client = self.client()
        if self.save_artifact and local_path is not None:
            client.log_artifacts(run_id, local_path, artifact_path=f"checkpoints/{name}")
        client.set_tag(run_id, f"checkpoint.{name}", url)

    def note(self, kind: str, index: int, text: str) -> None:
        """A tag ``<kind>.report_<index>`` and a line of the run's description."""
        run_id = self._run()
        line = f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] after report {index}: {text}"
        self.notes = f"{self.notes}\n{line}" if self.notes else line
        entities = require("mlflow.entities", "mlflow")
        self.client().log_batch(run_id, tags=[entities.RunTag(f"{kind}.report_{index}", text),
                                              entities.RunTag(NOTE_TAG, self.notes)])

    def end(self, failed: bool) -> None:
        if self.run_id is not None:
            self.client().set_terminated(self.run_id, "FAILED" if failed else "FINISHED")
