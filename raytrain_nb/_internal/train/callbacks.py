"""Run callbacks: ``after_report`` / ``after_exception`` hooks, and ready loggers.

A callback is any object with one or both hooks (Ray Train V2's ``UserCallback`` names)::

    class Print(UserCallback):
        def after_report(self, metrics, checkpoint):      # metrics: one dict per rank
            print(metrics[0]["loss"], checkpoint)
        def after_exception(self, errors):                 # rank -> exception
            print(errors)

Ray Train's three-argument form ``after_report(run_context, metrics, checkpoint)`` and
``after_exception(run_context, worker_exceptions)`` is accepted too. Hooks run on the driver
while the loop runs; a hook that raises is logged and never stops training.

Ready: :class:`JsonLoggerCallback` (``result.json``), :class:`CSVLoggerCallback`
(``progress.csv``) and :class:`TensorBoardCallback` (event files; skipped with a warning when
neither ``tensorboard`` nor ``tensorboardX`` is installed), all in the run directory.
Every metric is also always in ``metrics.jsonl``.
"""
from __future__ import annotations

import csv
import dataclasses
import inspect
import io
import json
import logging
import math
from typing import Any, Dict, List, Optional, Sequence

from ..checkpoint.storage import join, resolve, to_url

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class TrainRunContext:
    """What a callback may want to know about the run.

    Attributes:
        name: the run's name.
        run_dir: the run directory (local path or URL).
        world_size: the current number of workers.
        train_loop_config: the config passed to the training function.
        report_index: in ``after_report``, the report's index in the run (it keeps counting across restarts,
            resumes and kernels on the same run; None for a report without one).
    """

    name: str
    run_dir: str
    world_size: int
    train_loop_config: Optional[Dict[str, Any]] = None
    report_index: Optional[int] = None

    def get_run_config(self) -> Any:  # Ray Train's accessor, for callbacks written for it
        return self


class UserCallback:
    """Base class of run callbacks; override the hooks you need, in Ray Train's form (``run_context`` first) or
    without ``run_context``."""

    def setup(self, context: TrainRunContext) -> None:
        """Called once before the run starts."""

    def after_report(self, run_context: TrainRunContext, metrics: List[Dict[str, Any]],
                     checkpoint: Optional[Any]) -> None:
        """Called on the driver once every rank reported: ``metrics`` by rank, the committed checkpoint or None."""

    def after_exception(self, run_context: TrainRunContext, worker_exceptions: Dict[int, BaseException]) -> None:
        """Called when an attempt failed: rank -> the exception that rank raised."""

    def teardown(self) -> None:
        """Called once after the run ends (also after a failure)."""


def _arity(method: Any) -> int:
    try:
        params = [p for p in inspect.signature(method).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    except (TypeError, ValueError):
        return -1
    return len(params)


class CallbackRunner:
    """Calls the hooks of a list of callbacks, never letting one break the run."""

    def __init__(self, callbacks: Sequence[Any], context: TrainRunContext) -> None:
        self.callbacks = list(callbacks)
        self.context = context

    def _call(self, cb: Any, hook: str, *args: Any) -> None:
        method = getattr(cb, hook, None)
        if not callable(method):
            return
        try:
            if _arity(method) == len(args) + 1:  # Ray Train's form: run_context first
                method(self.context, *args)
            else:
                method(*args)
        except Exception:  # noqa: BLE001 - a callback never stops training
            logger.exception("callback %s.%s failed", type(cb).__name__, hook)

    def setup(self) -> None:
        for cb in self.callbacks:
            if _arity(getattr(cb, "setup", None)) == 1:  # ours; Ray Tune's setup(**info) is left alone
                self._call(cb, "setup", self.context)

    def after_report(self, metrics: List[Dict[str, Any]], checkpoint: Optional[Any]) -> None:
        for cb in self.callbacks:
            self._call(cb, "after_report", metrics, checkpoint)

    def after_exception(self, errors: Dict[int, BaseException]) -> None:
        for cb in self.callbacks:
            self._call(cb, "after_exception", errors)

    def teardown(self) -> None:
        for cb in self.callbacks:
            if _arity(getattr(cb, "teardown", None)) == 0:
                self._call(cb, "teardown")


class _FileLogger(UserCallback):
    """Writes rank 0's metrics to a file in the run directory (fsspec, any storage)."""

    filename = ""

    def __init__(self, path: Optional[str] = None) -> None:
        self.path = path
        self._lines: List[str] = []

    def setup(self, context: TrainRunContext) -> None:

        if self.path is None:
            self.path = join(context.run_dir, self.filename)

    def _append(self, text: str) -> None:

        fs, path = resolve(self.path)
        with fs.open(path, "ab") as f:
            f.write(text.encode("utf-8"))


class JsonLoggerCallback(_FileLogger):
    """Appends rank 0's metrics of each report to ``<run>/result.json``, one JSON object a line."""

    filename = "result.json"

    def after_report(self, metrics: List[Dict[str, Any]], checkpoint: Optional[Any]) -> None:
        row = dict(metrics[0]) if metrics else {}
        if checkpoint is not None:
            row["checkpoint_dir_name"] = getattr(checkpoint, "path", str(checkpoint)).rstrip("/").rsplit("/", 1)[-1]
        self._append(json.dumps(row, default=repr) + "\n")


class CSVLoggerCallback(_FileLogger):
    """Appends rank 0's metrics of each report to ``<run>/progress.csv`` (header from the first report)."""

    filename = "progress.csv"

    def __init__(self, path: Optional[str] = None) -> None:
        super().__init__(path)
        self._fields: Optional[List[str]] = None

    def after_report(self, metrics: List[Dict[str, Any]], checkpoint: Optional[Any]) -> None:
        row = dict(metrics[0]) if metrics else {}
        buf = io.StringIO()
        if self._fields is None:
            self._fields = list(row)
            csv.writer(buf).writerow(self._fields)
        extra = [k for k in row if k not in self._fields]
        if extra:
            logger.debug("progress.csv: keys %s were not in the first report; not written", extra)
        csv.writer(buf).writerow([row.get(k, "") for k in self._fields])
        self._append(buf.getvalue())


def tensorboard_writer_class() -> Optional[Any]:
    """``SummaryWriter`` from torch (needs tensorboard) or tensorboardX; None when neither works."""
    try:
        from torch.utils.tensorboard import SummaryWriter  # needs the tensorboard package

        return SummaryWriter
    except Exception:  # noqa: BLE001 - ImportError, or a broken install
        pass
    try:
        from tensorboardX import SummaryWriter  # type: ignore[no-redef]

        return SummaryWriter
    except Exception:  # noqa: BLE001
        return None


class TensorBoardCallback(UserCallback):
    """Writes rank 0's numeric metrics as TensorBoard scalars under ``<run>/tensorboard``.

    Skipped with one warning when neither ``tensorboard`` nor ``tensorboardX`` is installed.
    The step is the reported ``step`` / ``training_iteration`` when present, else the report count.
    """

    def __init__(self, logdir: Optional[str] = None) -> None:
        self.logdir = logdir
        self._writer: Any = None
        self._count = 0

    def setup(self, context: TrainRunContext) -> None:

        cls = tensorboard_writer_class()
        if cls is None:
            logger.warning("TensorBoardCallback skipped: install tensorboard (or tensorboardX) to write event files")
            return
        logdir = self.logdir or join(context.run_dir, "tensorboard")
        fs, path = resolve(logdir)
        if to_url(fs, path) != path:
            logger.warning("TensorBoardCallback writes local files only; %s is remote: skipped", logdir)
            return
        self.logdir = path
        self._writer = cls(log_dir=path)

    def after_report(self, metrics: List[Dict[str, Any]], checkpoint: Optional[Any]) -> None:
        if self._writer is None:
            return
        row = metrics[0] if metrics else {}
        self._count += 1
        step = next((row[k] for k in ("step", "training_iteration") if isinstance(row.get(k), int)), self._count)
        for key, value in row.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
                self._writer.add_scalar(key, value, step)
        self._writer.flush()

    def teardown(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


#: Ray Tune's name for the TensorBoard logger.
TBXLoggerCallback = TensorBoardCallback
