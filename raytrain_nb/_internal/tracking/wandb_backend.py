"""Weights & Biases' calls for a :class:`~.tracker.Tracker`, made on its background thread: one W&B run id per
run, resumed by every process segment (``resume="allow"``), logged to with explicit steps."""
from __future__ import annotations

import os
import secrets
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple

from ..checkpoint.storage import is_local, resolve
from ..extras import require
from .background import Rejected

DEFAULT_PROJECT = "raytrain_nb"


class WandbBackend:
    """One W&B run. The arguments are ``WandbLoggerCallback``'s (Ray's); ``init_kwargs`` go to ``wandb.init``.

    The run's files go to ``dir`` (default: the run directory when it is local, so an offline run's segments,
    ``<run>/wandb/offline-run-*``, sit beside its checkpoints). W&B's console capture is off by default (the
    notebook's output stays the notebook's).
    """

    def __init__(self, project: Optional[str] = None, group: Optional[str] = None, api_key_file: Optional[str] = None,
                 api_key: Optional[str] = None, excludes: Optional[Sequence[str]] = None,
                 upload_checkpoints: bool = False, **init_kwargs: Any) -> None:
        self.project = project or os.environ.get("WANDB_PROJECT") or DEFAULT_PROJECT
        self.group = group or os.environ.get("WANDB_RUN_GROUP")
        self.api_key_file = api_key_file
        self.api_key = api_key
        self.excludes = set(excludes or ())
        self.upload_checkpoints = upload_checkpoints
        self.init_kwargs = init_kwargs
        self.run: Any = None
        self.run_id: Optional[str] = None
        self.notes: List[str] = []
        self.kinds: List[str] = []
        self._id: Optional[str] = None

    def describe(self) -> str:
        mode = self.init_kwargs.get("mode") or os.environ.get("WANDB_MODE") or "online"
        return f"Weights & Biases ({mode}, project {self.project})"

    def state_key(self) -> str:
        entity = self.init_kwargs.get("entity") or os.environ.get("WANDB_ENTITY") or ""
        return f"wandb {entity}/{self.project}"

    @staticmethod
    def permanent(exc: BaseException) -> bool:
        """W&B's usage errors and bad values cannot be fixed by retrying; its communication errors can."""
        return type(exc).__name__ == "UsageError" or isinstance(exc, (TypeError, ValueError))

    def _set_api_key(self) -> None:
        key = self.api_key
        if self.api_key_file:
            with open(os.path.expanduser(self.api_key_file)) as f:
                key = f.readline().strip()
        if key:
            os.environ["WANDB_API_KEY"] = key  # as Ray's callback does

    def open(self, stored: Mapping[str, Any], run_name: str, run_url: str) -> None:
        """``wandb.init`` with the run id ``stored`` names (a new one the first time), ``resume="allow"``."""
        wandb = require("wandb")
        self._set_api_key()
        previous = stored.get("run_id")
        self._id = previous if isinstance(previous, str) and previous else (self._id or secrets.token_hex(4))
        self.notes = [str(n) for n in stored.get("notes", [])] if isinstance(stored.get("notes"), list) else []
        self.kinds = [str(k) for k in stored.get("kinds", [])] if isinstance(stored.get("kinds"), list) else []
        kwargs: Dict[str, Any] = {"project": self.project, "group": self.group, "name": run_name,
                                  "id": self._id, "resume": "allow", "reinit": "create_new",
                                  "dir": _local_dir(run_url), "settings": wandb.Settings(console="off", silent=True)}
        kwargs.update(self.init_kwargs)
        if self.notes:  # in the run's first record: an update sent after init may not be written before a quick
            # finish (an offline segment that ended 0.1 s after it began was seen without them)
            kwargs["notes"] = "\n".join(self.notes)
            kwargs["tags"] = tuple(dict.fromkeys(tuple(kwargs.get("tags") or ()) + tuple(self.kinds)))
        self.run = wandb.init(**kwargs)
        self.run_id = self.run.id

    def state_entry(self) -> Dict[str, Any]:
        return {"run_id": self.run_id, "notes": list(self.notes), "kinds": list(self.kinds)}

    def _active(self) -> Any:
        if self.run is None:
            raise Rejected("the tracked run could not be opened (see the warning before)")
        return self.run

    def log_metrics(self, rows: List[Tuple[int, Dict[str, float], float]]) -> None:
        run = self._active()
        for step, row, _ in rows:
            run.log({k: v for k, v in row.items() if k not in self.excludes}, step=step)

    def log_params(self, params: Dict[str, Any], index: int) -> None:
        self._active().config.update(params, allow_val_change=True)

    def log_checkpoint(self, index: int, name: str, url: str, local_path: Optional[str]) -> None:
        """An artifact per checkpoint: its files with ``upload_checkpoints`` (local storage), else a reference
        to its location."""
        wandb = require("wandb")
        run = self._active()
        artifact = wandb.Artifact(f"checkpoint-{run.id}", type="checkpoint",
                                  metadata={"report_index": index, "name": name, "url": url})
        if self.upload_checkpoints and local_path is not None:
            artifact.add_dir(local_path)
        else:
            artifact.add_reference(f"file://{local_path}" if local_path is not None else url, checksum=False)
        run.log_artifact(artifact, aliases=[name])

    def note(self, kind: str, index: int, text: str) -> Dict[str, Any]:
        """A tag ``kind`` and a line of the run's notes (kept in the run directory: an offline segment starts
        with the notes of the ones before)."""
        run = self._active()
        self.notes.append(f"after report {index}: {text}")
        if kind not in self.kinds:
            self.kinds.append(kind)
        run.notes = "\n".join(self.notes)
        run.tags = tuple(dict.fromkeys(tuple(run.tags or ()) + (kind,)))
        return {"notes": list(self.notes), "kinds": list(self.kinds)}

    def end(self, failed: bool) -> None:
        if self.run is not None:
            self.run.finish(exit_code=1 if failed else 0)


def _local_dir(run_url: str) -> Optional[str]:
    """The run directory as a local path (None on remote storage: W&B's default folder)."""
    try:
        fs, path = resolve(run_url)
    except Exception:  # noqa: BLE001 - an unknown protocol: W&B's default folder
        return None
    return path if is_local(fs) else None
