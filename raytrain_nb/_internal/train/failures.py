"""Ray Train V2's errors of ``fit()``: ``TrainingFailedError`` and, beneath it, ``WorkerGroupError`` (the workers
failed), ``ControllerError`` (the run could not start or recover them), ``NCCLHangError``, ``PreemptionError``.

Each pickles with everything it holds (``__reduce__``), and shows in IPython as its message: each failed rank's
traceback, not our stack.
"""
from __future__ import annotations

from typing import Any, Dict, List, Optional

from ..errors import RaytrainNbError


class TrainingFailedError(RaytrainNbError):
    """``fit()`` failed (Ray Train V2's ``TrainingFailedError``): a :class:`WorkerGroupError` (the workers failed
    more often than ``FailureConfig(max_failures)`` allows) or a :class:`ControllerError` (the run itself could not
    start or recover its workers). Catch this class for either.

    Attributes (ours, beside Ray's):
        error: the last ``WorkerError`` of the run (``.failures``: each rank's type, message, traceback).
        failures: how many attempts failed.
        result: the ``Result`` so far (path, metrics, checkpoint), its ``error`` this exception.
    """

    error: Optional[BaseException] = None
    failures: int = 0
    result: Optional[Any] = None

    def _render_traceback_(self) -> List[str]:  # IPython: the worker's traceback, not our stack
        return str(self).splitlines()


class WorkerGroupError(TrainingFailedError):
    """Workers failed during training, more often than ``FailureConfig(max_failures)`` allows (Ray Train V2's).

    Args:
        error_message: each failed rank's traceback (identical ones merged), as the message shows it.
        worker_failures: rank -> the exception that rank raised (``WorkerError.exceptions``).
    """

    def __init__(self, error_message: str, worker_failures: Dict[int, BaseException]) -> None:
        super().__init__("Training failed due to worker errors:\n" + error_message)
        self._error_message = error_message
        self.worker_failures = dict(worker_failures)

    def __reduce__(self):
        return (type(self), (self._error_message, self.worker_failures), dict(self.__dict__))


class NCCLHangError(WorkerGroupError):
    """Ray Train's NCCL hang detector found a stuck collective. Never raised here (Ray's detector is off by
    default): a collective that times out (``TorchConfig(timeout_s)``) fails its ranks, and ``fit()`` raises a
    :class:`WorkerGroupError` holding their errors."""


class ControllerError(TrainingFailedError):
    """The run could not start or recover its workers (Ray Train V2's ``ControllerError``): the cluster cannot place
    them, a lost worker's place did not come back, the run's storage or lease failed.

    Args:
        controller_failure: the underlying error (a ``ResourceError``, ``StorageError``, ...).
        context: what the run was doing, put before the failure in the message.
    """

    def __init__(self, controller_failure: BaseException, context: str = "") -> None:
        super().__init__("Training failed due to controller error:\n" + (f"{context}: " if context else "")
                         + str(controller_failure))
        self.controller_failure = controller_failure
        self.context = context
        self.with_traceback(controller_failure.__traceback__)

    def __reduce__(self):
        return (type(self), (self.controller_failure, self.context), dict(self.__dict__))


class PreemptionError(TrainingFailedError):
    """Node preemption interrupted training (Ray Train V2's). Never raised here: nothing tells raytrain_nb of a
    preemption ahead of time, so a preempted node's workers are lost workers (``WorkerDiedError`` in
    :attr:`WorkerGroupError.worker_failures`), counted against ``max_failures``."""

    def __init__(self, preemption_info: Any, drain_timed_out: bool = False) -> None:
        self.preemption_info = preemption_info
        self.drain_timed_out = drain_timed_out
        super().__init__(f"Training was interrupted by node preemption (preempted_ranks="
                         f"{getattr(preemption_info, 'preempted_ranks', None)}, drain_timed_out={drain_timed_out}).")

    def __reduce__(self):
        return (type(self), (self.preemption_info, self.drain_timed_out), dict(self.__dict__))
