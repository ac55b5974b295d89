"""Validation of reported checkpoints in Ray tasks apart from the workers (Ray Train V2's ``ValidationConfig``):
one at a time, in report order; the metrics it returns are merged into that checkpoint's, which is ranked again;
a timeout or an error is recorded on the checkpoint and never fails training."""
from __future__ import annotations

import collections
import logging
import threading
import time
from typing import Any, Deque, Dict, Optional, Tuple

from ..checkpoint.run_storage import RunStorage
from ..errors import describe
from .timing import CONTROL_START_S

logger = logging.getLogger(__name__)

#: How long a validation task may wait before we look whether a CPU is free for it, and how often we look.
START_CHECK_S, LOOK_S = 2.0, 0.2
#: How often a wait for pending validations says what it waits for.
SAY_S = 30.0


def run_validation(fn: Any, checkpoint: Any, kwargs: Dict[str, Any]) -> Any:
    """In the validation's Ray task: ``fn(checkpoint, **kwargs)``."""
    return fn(checkpoint, **kwargs)


class Validations:
    """The validations of one run's reported checkpoints; :meth:`submit` is the run storage's ``on_commit``."""

    def __init__(self, run: RunStorage, config: Any) -> None:
        self.run = run
        self.config = config
        self._queue: Deque[Tuple[str, Any, Dict[str, Any]]] = collections.deque()
        self._cond = threading.Condition()
        self._thread: Optional[threading.Thread] = None
        #: the checkpoint being validated now, and why it does not start (no free CPU), for views
        self.current: Optional[str] = None
        self.notice: str = ""

    def submit(self, entry: Any, spec: Optional[Dict[str, Any]]) -> None:
        """Validate ``entry`` after those submitted before it (``spec``: what its report asked; None: nothing)."""
        if not spec:
            return
        with self._cond:
            self._queue.append((entry.name, entry.checkpoint, spec))
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name="rtnb-validations", daemon=True)
                self._thread.start()

    def pending(self) -> int:
        """How many validations are queued or running."""
        with self._cond:
            return len(self._queue) + (self.current is not None)

    def _loop(self) -> None:
        while True:
            with self._cond:
                if not self._queue:
                    self._thread, self.current = None, None
                    self._cond.notify_all()
                    return
                name, checkpoint, spec = self._queue.popleft()
                self.current = name
            status, metrics, error = self._run_one(name, checkpoint, spec)
            try:
                self.run.manager.update(name, metrics, dict(status=status, **({"error": error} if error else {})))
            except Exception as exc:  # noqa: BLE001 - a validation never fails training
                logger.warning("could not record the validation of %s: %s", name, describe(exc))
            with self._cond:
                self.current, self.notice = None, ""

    def _run_one(self, name: str, checkpoint: Any, spec: Dict[str, Any]) -> Tuple[str, Dict[str, Any], str]:
        """``(status, metrics, error)`` of one validation task."""
        import ray  # ray: loaded when a group runs, not on import raytrain_nb

        task = self.config.task_config
        kwargs = dict(task.fn_kwargs or {}, **(spec.get("fn_kwargs") or {}))
        timeout = spec.get("timeout_s") or task.timeout_s
        options = dict({"num_cpus": 1}, **self.config.ray_remote_kwargs)
        started = time.monotonic()
        try:
            ref = ray.remote(**options)(run_validation).remote(self.config.fn, checkpoint, kwargs)
        except Exception as exc:  # noqa: BLE001 - bad ray_remote_kwargs: recorded, never raised into training
            return "failed", {}, f"the validation task could not be submitted: {describe(exc)}"
        looked = False
        while not ray.wait([ref], timeout=LOOK_S)[0]:
            waited = time.monotonic() - started
            if not looked and waited >= START_CHECK_S:
                looked = True
                self._say_if_no_cpu(name, options)
            if timeout is not None and waited >= timeout:
                ray.cancel(ref, force=True)
                logger.warning("the validation of %s took more than timeout_s=%s: recorded as VALIDATION_TIMEOUT",
                               name, timeout)
                return "timeout", {}, f"took more than timeout_s={timeout}"
        try:
            metrics = ray.get(ref, timeout=60)
        except Exception as exc:  # noqa: BLE001 - the user's function failed: recorded on the checkpoint
            logger.warning("the validation of %s failed: %s", name, describe(exc).splitlines()[-1])
            return "failed", {}, describe(exc).splitlines()[-1][:500]
        if not isinstance(metrics, dict):
            return "failed", {}, f"the validation function returned {type(metrics).__name__}, not a dict of metrics"
        return "validated", metrics, ""

    def _say_if_no_cpu(self, name: str, options: Dict[str, Any]) -> None:
        import ray  # ray: loaded when a group runs, not on import raytrain_nb

        need = float(options.get("num_cpus") or 0)
        free = ray.available_resources().get("CPU", 0.0)
        if need > free:
            self.notice = (f"the validation of {name} waits for {need:g} CPU: {free:g} free (the training workers hold "
                           "the rest); it starts when one frees; give the workers fewer CPUs, start Ray with more "
                           "(RAYTRAIN_NB_NUM_CPUS), or pass ray_remote_kwargs={'num_cpus': 0.5}")
            logger.warning("%s", self.notice)

    def wait(self, timeout_s: Optional[float] = None) -> bool:
        """Wait until no validation is pending (``fit()``'s end, as Ray Train's); False if ``timeout_s`` passed."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._thread is not None:
                left = SAY_S if deadline is None else min(SAY_S, deadline - time.monotonic())
                if left <= 0:
                    return False
                if not self._cond.wait(left) and (deadline is None or time.monotonic() < deadline):
                    logger.warning("waiting for %d validation(s) of reported checkpoints (now: %s)",
                                   len(self._queue) + 1, self.current)
        return True


def attach(run: RunStorage, fn: Any, task_config: Any = None, ray_remote_kwargs: Any = None) -> Validations:
    """Validate ``run``'s reported checkpoints whose report asked for it with ``fn`` (a ``ValidationConfig`` or a
    function, with its ``task_config`` and ``ray_remote_kwargs``).

    Raises:
        ValueError: ``fn`` is not callable, or bad task arguments (as ``ValidationConfig`` checks them).
    """
    from ..worker.report_api import ValidationConfig  # the worker's names: no fsspec or ray at import

    config = fn if isinstance(fn, ValidationConfig) else ValidationConfig(fn, task_config, ray_remote_kwargs)
    validations = Validations(run, config)
    run.validator, run.on_commit = validations, validations.submit
    return validations


def attach_to_group(core: Any, fn: Any, task_config: Any = None, ray_remote_kwargs: Any = None) -> Validations:
    """:func:`attach` for a group's run, and tell its workers that ``report(validation=...)`` is allowed now."""
    validations = attach(core.run_storage, fn, task_config, ray_remote_kwargs)
    core.collect([s.actor.set_storage.remote(core.run_storage.url, True) for s in core.slots], CONTROL_START_S,
                 "set the validation of")
    return validations


def of(run: RunStorage) -> Optional[Validations]:
    """The run's validations, or None when it has no validation function."""
    found = getattr(run, "validator", None)
    return found if isinstance(found, Validations) else None
