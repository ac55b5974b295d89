"""What the XGBoost and LightGBM ``RayTrainReportCallback``s share: naming metrics, reporting, saving the model."""
from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Union

from ..checkpoint.checkpoint import Checkpoint
from ..worker import session

Metrics = Optional[Union[str, List[str], Dict[str, str]]]
PostProcess = Optional[Callable[[Dict[str, Any]], Dict[str, Any]]]


def flatten(tree: Mapping[str, Any], delimiter: str = "-", prefix: str = "") -> Dict[str, Any]:
    """``{"eval": {"rmse": x}}`` -> ``{"eval-rmse": x}`` (Ray Tune's ``flatten_dict``)."""
    out: Dict[str, Any] = {}
    for key, value in tree.items():
        name = f"{prefix}{delimiter}{key}" if prefix else str(key)
        if isinstance(value, Mapping):
            out.update(flatten(value, delimiter, name))
        else:
            out[name] = value
    return out


class ReportOptions:
    """The arguments of Ray Train's ``RayTrainReportCallback`` for XGBoost and LightGBM, and what they do."""

    def __init__(self, metrics: Metrics = None, filename: str = "", frequency: int = 0, checkpoint_at_end: bool = True,
                 results_postprocessing_fn: PostProcess = None) -> None:
        if isinstance(metrics, str):
            metrics = [metrics]
        if metrics is not None and not isinstance(metrics, (list, tuple, dict)):
            raise ValueError(f"RayTrainReportCallback(metrics={metrics!r}): pass a metric name, a list of names, "
                             "or a dict {reported name: library's metric name}")
        if isinstance(frequency, bool) or not isinstance(frequency, int) or frequency < 0:
            raise ValueError(f"RayTrainReportCallback(frequency={frequency!r}): pass a whole number >= 0 "
                             "(0: no checkpoints during training)")
        self.metrics = metrics
        self.filename = filename
        self.frequency = frequency
        self.checkpoint_at_end = checkpoint_at_end
        self.postprocess = results_postprocessing_fn

    def report_dict(self, results: Dict[str, Any]) -> Dict[str, Any]:
        """The metrics to report from the flattened results (each value its latest one)."""
        if not self.metrics:
            out = dict(results)
        else:
            pairs = self.metrics.items() if isinstance(self.metrics, dict) else ((m, m) for m in self.metrics)
            out = {}
            for key, metric in pairs:
                if metric not in results:
                    raise KeyError(f"RayTrainReportCallback: metric {metric!r} is not among the results "
                                   f"({', '.join(sorted(results)) or 'none yet'}): name one of them")
                out[key] = results[metric]
        return self.postprocess(out) if self.postprocess else out


def is_rank_zero() -> bool:
    """Rank 0 of the group, or a process outside one (a Tune trial without a trainer)."""
    try:
        return session.get_context().get_world_rank() == 0
    except RuntimeError:
        return True


@contextlib.contextmanager
def saved(save: Callable[[str], Any], filename: str) -> Iterator[Optional[Checkpoint]]:
    """On rank 0, a checkpoint of a temporary directory holding ``save(path/filename)``; elsewhere None."""
    if not is_rank_zero():
        yield None
        return
    with tempfile.TemporaryDirectory() as tmp:
        save(Path(tmp, filename).as_posix())
        yield Checkpoint.from_directory(tmp)


def report(metrics: Dict[str, Any], checkpoint: Optional[Checkpoint] = None) -> None:
    """``raytrain_nb.report`` (every rank reports; only rank 0 passes the checkpoint)."""
    session.report(metrics, checkpoint=checkpoint)


def booster_checkpoint(cls: Any, booster: Any, preprocessor: Any, path: Optional[str]) -> Any:
    """``cls.from_model``: save ``booster`` as ``cls.MODEL_FILENAME`` into ``path`` (default: a new temporary
    directory) and return its checkpoint of class ``cls``.

    Raises:
        ValueError: ``path`` is not a directory, or a ``preprocessor`` is given (not supported).
    """
    if preprocessor is not None:
        raise ValueError(f"{cls.__name__}.from_model(preprocessor=...) is not supported by raytrain_nb: "
                         "save the preprocessor in the checkpoint directory yourself")
    directory = Path(path or tempfile.mkdtemp())
    if not directory.is_dir():
        raise ValueError(f"{cls.__name__}.from_model(path={str(path)!r}): not a directory; pass an empty one")
    booster.save_model(directory.joinpath(cls.MODEL_FILENAME).as_posix())
    return cls.from_directory(directory.as_posix())
