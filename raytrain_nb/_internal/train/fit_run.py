"""One ``fit()``: start the group, run attempts until one succeeds, recover between them.

The state of a run is the loop in :meth:`FitRun.run`: start -> attempt -> (failed -> decide ->
recover -> attempt)* -> done. Decisions come from :mod:`.elastic`; everything shown while it runs
(progress line, worker output, callbacks, the elastic growth check) hangs off one
:class:`~.progress.ReportCollector` fed by ``group.subscribe_metrics``.
"""
from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from .. import cluster, frontend
from ..checkpoint.metrics_log import read_metrics
from ..checkpoint.reported import report_index
from ..checkpoint.storage import as_fsspec, default_storage_path, is_local, resolve
from ..errors import (ConfigError, GroupError, ResourceError, RunInUseError, WorkerError, cut_lines,
                      format_ranks, merge_failures)
from ..group.config import GroupConfig
from ..group.datasets import attach, ensure_fresh
from ..group import policy, validations
from ..group.group import WorkerGroup
from . import elastic
from .callbacks import CallbackRunner, TrainRunContext
from .config import RunConfig
from .failures import ControllerError, TrainingFailedError, WorkerGroupError
from .progress import ProgressLine, ReportCollector, TrainSink, in_notebook
from .result import Result
from .train_loop import load_return_value, run_loop
from .trial import check_beside_trial, current_trial

if TYPE_CHECKING:
    from .trainer import DataParallelTrainer

logger = logging.getLogger(__name__)

#: Seconds an elastic start waits for each size before trying one worker fewer.
ELASTIC_START_WAIT_S = 5.0
#: Recoveries tried after one failure (new workers can die while starting when a node is lost meanwhile).
RECOVERY_TRIES = 3
#: At most one growth check per this many seconds while the loop runs.
GROWTH_CHECK_INTERVAL_S = 1.0


def storage_path_for(run_config: RunConfig) -> Optional[str]:
    """The storage URL the group gets, honouring ``storage_filesystem`` where workers can rebuild it.

    Raises:
        ConfigError: a filesystem whose options cannot reach the workers (naming the fix).
    """

    if run_config.storage_filesystem is None:
        return run_config.storage_path
    given = run_config.storage_filesystem
    fs = as_fsspec(given)
    raw = run_config.storage_path or default_storage_path()
    if is_local(fs) or getattr(given, "type_name", None) == "local":
        return resolve(raw, fs)[1]
    options = {k: v for k, v in (getattr(fs, "storage_options", None) or {}).items() if v is not None}
    if type(given).__module__.startswith("pyarrow") or options:
        raise ConfigError(
            f"RunConfig(storage_filesystem={given!r}): workers rebuild the filesystem from the storage URL, "
            "so its options cannot reach them: pass storage_path='<protocol>://bucket/path' with the options "
            "in the environment (e.g. AWS_ENDPOINT_URL, or FSSPEC_<PROTOCOL>_<OPTION>) and no storage_filesystem")
    return fs.unstrip_protocol(resolve(raw, fs)[1])


def render_failures(exc: WorkerError) -> str:
    """Each rank's traceback (identical ones merged), without the notebook's recovery hints."""

    parts = []
    for ranks, f in merge_failures(exc.failures):
        body = cut_lines(f.traceback) if f.traceback else f"{f.type_name}: {f.message}"
        parts.append(f"[{format_ranks(ranks)}]{f' on node {f.node}' if f.node else ''}\n{body}")
    return "\n\n".join(parts)


class FitRun:
    """The driver side of one ``trainer.fit()``."""

    def __init__(self, trainer: "DataParallelTrainer") -> None:
        self.t = trainer
        self.scaling = trainer.scaling_config
        self.run_config = trainer.run_config
        self.group: Optional["WorkerGroup"] = None
        self.collector = ReportCollector(1)
        self.progress: Optional[ProgressLine] = None
        self.callbacks: Optional[CallbackRunner] = None
        self._grow_to: Optional[int] = None
        self._last_growth_check = 0.0
        self._seen_checkpoint = False
        self.timings: Dict[str, float] = {}
        #: what the run was doing, for a ControllerError's message
        self.phase = "fit() could not start its workers"
        # Inside a Ray Tune trial the group waits for resources as long as the trial lives: Tune decides how
        # many trials run at once (max_concurrent_trials, trial resources), not a deadline.
        self.trial = current_trial()
        self.fixed_wait_s: Optional[float] = None if self.trial is not None else elastic.RESOURCE_WAIT_S

    # -- the group -----------------------------------------------------------------------------

    def _new_group(self, n: int, wait_s: Optional[float]) -> "WorkerGroup":

        ckpt = self.run_config.checkpoint_config
        return WorkerGroup(n, backend=self.t.backend, name=self.t.name, storage_path=self.t.storage_path,
                           num_to_keep=ckpt.num_to_keep if ckpt else None,
                           checkpoint_score_attribute=ckpt.checkpoint_score_attribute if ckpt else None,
                           checkpoint_score_order=ckpt.checkpoint_score_order if ckpt else "max",
                           placement_timeout_s=wait_s, activate=False,
                           runtime_env=self.run_config.worker_runtime_env, **self.scaling.group_kwargs())

    def _start_group(self) -> "WorkerGroup":
        """A group of ``num_workers`` (elastic: as many as fit, from ``max`` down to ``min``)."""

        bundle = GroupConfig(num_workers=1, **self.scaling.group_kwargs()).bundle()
        if self.trial is not None:
            import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

            check_beside_trial(self.trial, bundle, self.scaling.min_workers, ray.cluster_resources())
        if not self.scaling.elastic:
            group = self._new_group(self.scaling.max_workers, self.fixed_wait_s)
        else:
            n = elastic.start_size(self.scaling, bundle)
            while True:
                try:
                    group = self._new_group(n, ELASTIC_START_WAIT_S if n > self.scaling.min_workers
                                            else self.fixed_wait_s)
                    break
                except ResourceError:
                    if n <= self.scaling.min_workers:
                        raise
                    n -= 1
        group.subscribe_metrics(self.collector.on_records)
        if getattr(self.t, "validation_config", None) is not None:
            group.validation(self.t.validation_config)
        if self.t.datasets:

            attach(group, self.t.datasets, self.t.dataset_config)
            self._warn_data_cpus()
        self.group = group
        return group

    def _warn_data_cpus(self) -> None:
        import ray  # ray: loaded when a group or trainer runs, not on import raytrain_nb

        if ray.available_resources().get("CPU", 0.0) < 1.0:
            logger.warning("the workers hold every CPU of the cluster: Ray Data has none left to read and transform "
                           "the datasets and may stall; give the workers fewer CPUs (resources_per_worker) or "
                           "start Ray with more (RAYTRAIN_NB_NUM_CPUS)")

    # -- listeners -----------------------------------------------------------------------------

    def _after_report(self, name: str, metrics: List[Dict[str, Any]], records: List[Dict[str, Any]]) -> None:
        checkpoint = None
        if any(r.get("checkpoint") for r in records):
            self._seen_checkpoint = True

            entry = self.group.run_storage.manager.by_report(report_index(name))  # named by checkpoint_dir_name too
            checkpoint = entry.checkpoint if entry is not None else None  # None: pruned at once, or not committed
        if self.callbacks is not None:
            self.callbacks.context.report_index = report_index(name)
            self.callbacks.after_report(metrics, checkpoint)
        self._check_growth(checkpoint is not None)

    def _check_growth(self, at_checkpoint: bool) -> None:
        """Elastic: when resources for more workers are back, stop the loop (then grow and resume)."""
        group = self.group
        if (not self.scaling.elastic or self._grow_to is not None or group is None
                or group.num_workers >= self.scaling.max_workers or (self._seen_checkpoint and not at_checkpoint)):
            return
        now = time.monotonic()
        if now - self._last_growth_check < GROWTH_CHECK_INTERVAL_S and not at_checkpoint:
            return
        self._last_growth_check = now
        try:
            more = elastic.growth(group, self.scaling)
        except Exception:  # noqa: BLE001 - a failed check only delays growth
            logger.debug("growth check failed", exc_info=True)
            return
        if more > 0:
            self._grow_to = group.num_workers + more
            self._notice(f"resources for {more} more worker(s) are free: stopping the loop to grow to "
                         f"{self._grow_to} workers; it resumes from the newest checkpoint")
            group.interrupt()

    def _notice(self, text: str) -> None:
        logger.info(text)
        if self.progress is not None and self.run_config.verbose != 0:
            self.progress.write(f"({self.t.name}) {text}\n")

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> Result:
        """Start the group, run attempts until one succeeds, shut the group down.

        Raises:
            WorkerGroupError: the workers failed more often than ``max_failures`` allows.
            ControllerError: the run could not start or recover its workers (its ``controller_failure`` says why).
            RunInUseError: another trainer or group holds the run (``RunConfig(name)``): pick another name.
        """
        started = time.perf_counter()
        cluster.connect()
        try:
            value = self._attempts(started)
            self._wait_validations()
        except (TrainingFailedError, ConfigError, RunInUseError):  # the user's to fix, named as it is
            raise
        except Exception as exc:  # the run's own machinery failed, not the workers: Ray Train V2's ControllerError
            raise self._controller_error(exc, None, self.phase) from exc
        finally:
            self.timings["total_s"] = time.perf_counter() - started
            if self.callbacks is not None:
                self.callbacks.teardown()
            if self.progress is not None:
                self.progress.close()
            if self.group is not None:
                self.group.shutdown()
        return self._result(None, load_return_value(value))

    def _wait_validations(self) -> None:
        """Before ``fit()`` returns: every pending validation ends (recorded on its checkpoint), as in Ray Train."""
        found = validations.of(self.group.run_storage) if self.group is not None else None
        if found is not None and found.pending():
            self._notice(f"waiting for {found.pending()} validation(s) of reported checkpoints")
            found.wait()  # no deadline: each validation has its own timeout_s (None: as the user's function takes)

    def _attempts(self, started: float) -> Optional[bytes]:
        """Run attempts until one succeeds; rank 0's pickled return value."""
        verbose = self.run_config.verbose
        failures = 0
        group = self._start_group()
        self.phase = "fit() failed while its workers ran"
        shown = verbose != 0 and in_notebook() and frontend.show_fit_dashboard(group)
        self.progress = ProgressLine(enabled=verbose != 0 and not shown, desc=self.t.name)
        self.collector.listeners = [self.progress.on_report, self._after_report]
        sink = TrainSink(self.progress)
        self.timings["startup_s"] = time.perf_counter() - started
        self.callbacks = CallbackRunner(self.run_config.callbacks or [], TrainRunContext(
            self.t.name, group.run_storage.url, group.num_workers, self.t.train_loop_config))
        self.callbacks.setup()
        while True:
            group = self.group
            self._prepare_attempt(group)
            try:
                return group.execute(run_loop, self.t.train_loop_per_worker, self.t.train_loop_config,
                                     self.t.with_config, self.t.resume_from_checkpoint, self.t.metadata,
                                     self.t.pg_timeout_s, sink=sink, output="all")[0]
            except WorkerError as exc:
                if self._grow_to is not None:
                    target, self._grow_to = self._grow_to, None
                    self._recover(exc, target)
                    continue
                if any(f.type_name == "KeyboardInterrupt" for f in exc.failures):
                    raise KeyboardInterrupt("fit() was interrupted") from None
                self.callbacks.after_exception(exc.exceptions)
                failures += 1
                limit = self.run_config.max_failures
                if limit != -1 and failures > limit:
                    raise self._failed(exc, failures) from None
                self._notice(f"attempt {failures} failed:\n{render_failures(exc)}")
                self._recover(exc, None, f"restart {failures}/{'unlimited' if limit == -1 else limit}", failures)

    def _prepare_attempt(self, group: "WorkerGroup") -> None:

        self.collector.reset(group.num_workers)
        self.progress.start_attempt()
        if self.callbacks is not None:
            self.callbacks.context.world_size = group.num_workers
        if self.t.datasets:
            ensure_fresh(group)

    def _recover(self, exc: WorkerError, grow_to: Optional[int], why: str = "", failures: int = 0) -> None:
        """Decide (or grow to ``grow_to``) and carry it out; a recovery that fails ends the run.

        A recovery whose new workers die while starting (their node was lost meanwhile) is decided
        again from the group's state, up to ``RECOVERY_TRIES`` times; missing resources end the run.

        Raises:
            ControllerError: the recovery failed (its ``controller_failure`` says why; ``error``: ``exc``).
        """
        for attempt in range(1, RECOVERY_TRIES + 1):
            group = self.group
            try:
                if grow_to is not None:
                    decision: policy.Decision = policy.Resize(grow_to, f"growing to {grow_to} workers")
                else:
                    decision = elastic.decide(group, exc, self.scaling)
                if self.t.fresh_processes and not isinstance(decision, policy.Recreate):
                    decision = policy.Recreate(group.num_workers, f"{decision.reason}; fresh processes for every "
                                                f"rank ({type(self.t).__name__}: {self.t.fresh_processes})")
                if grow_to is None:
                    self._notice(f"{why}: {decision.reason}; the loop runs again from the newest checkpoint")
                if isinstance(decision, policy.Recreate):
                    group.shutdown()  # the new group's run storage settles what the failure left
                    self.group = None
                    self._start_group()
                else:
                    policy.carry_out(group, decision)
                return
            except GroupError as err:
                if isinstance(err, ResourceError) or attempt == RECOVERY_TRIES or self.group is None:
                    raise self._controller_error(err, exc, "fit() could not recover after a failure",
                                                 failures) from err
                self._notice(f"recovery failed ({err}); deciding again")
                grow_to, why = None, why or "recovery"

    def _failed(self, exc: WorkerError, failures: int) -> WorkerGroupError:
        """The run's end after too many failures: each rank's exception and traceback, the run so far."""
        limit = self.run_config.max_failures
        head = (f"{', '.join(f'rank {r}' for r in exc.ranks) or 'a worker'} failed, after {failures - 1} restart(s) "
                f"(FailureConfig(max_failures={limit})); the run is in {self.group.run_storage.url}")
        error = WorkerGroupError(f"{head}\n\n{render_failures(exc)}", exc.exceptions)
        return self._settled(error, exc, failures)

    def _controller_error(self, err: BaseException, exc: Optional[WorkerError], context: str,
                          failures: int = 0) -> ControllerError:
        """The run's end because its machinery failed (``err``), after the workers' ``exc`` if any."""
        return self._settled(ControllerError(err, context), exc, failures)

    def _settled(self, error: Any, exc: Optional[WorkerError], failures: int) -> Any:
        error.error, error.failures = exc, failures
        error.result = self._result(error)
        return error

    def _result(self, error: Optional[BaseException], return_value: Any = None) -> Result:

        group = self.group
        if group is None:
            return Result(metrics=None, checkpoint=None, error=error, path="")
        url = group.run_storage.url
        try:
            records = read_metrics(url)
        except Exception as exc:  # noqa: BLE001 - a result without metrics beats no result
            logger.warning("cannot read %s/metrics.jsonl: %s", url, exc)
            records = []
        result = Result.from_run(url, group.run_storage.manager, records, error)
        result.return_value = return_value
        return result
