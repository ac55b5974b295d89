"""The TensorFlow framework backend: ``TF_CONFIG`` on every rank for ``tf.distribute.MultiWorkerMirroredStrategy``.

For each set of worker processes the driver asks every rank for a free port once and writes the cluster
(``{"cluster": {"worker": [host:port, ...]}, "task": {"type": "worker", "index": rank}}``); each cell and
training function then runs with that ``TF_CONFIG`` in its environment, and with ``TF_USE_LEGACY_KERAS=1``
unless the user set it: TensorFlow 2.16+ makes ``tf.keras`` Keras 3, with which the strategy's
``model.fit`` fails, and the legacy Keras 2 (the ``tf-keras`` package) is read only if the variable is set
before TensorFlow first loads Keras. TensorFlow reads ``TF_CONFIG`` once, when the strategy is created, and
cannot form its collective again in a live process: a group whose processes change needs fresh processes
for every rank (``TensorflowTrainer`` starts them on every failure).
"""
from __future__ import annotations

import collections
import contextlib
import json
import logging
import os
from typing import Any, Dict, Iterator, List, Sequence, Tuple

from ..waits import get_within
from ..worker.framework import STOP_AFTER_PEER_FAILURE_S, FrameworkBackend
from ..worker.keras_models import is_keras_model
from ..worker.walk import walk

logger = logging.getLogger(__name__)

#: Seconds every rank has to answer with a free port for TensorFlow's server.
PORTS_S = 30.0
LOOPBACK = "127.0.0.1"
#: The clusters remembered, one per set of worker processes (a group's, a trainer's attempt's).
REMEMBERED = 16
LEGACY_KERAS = "TF_USE_LEGACY_KERAS"


def _process_key(workers: Sequence[Any]) -> Tuple[str, ...]:
    return tuple(w.actor._actor_id.hex() for w in workers)


class TensorflowBackend(FrameworkBackend):
    """``tensorflow``: one ``TF_CONFIG`` per set of worker processes, set around every cell."""

    name = "tensorflow"
    extra = "tensorflow"
    fresh_processes = "TensorFlow cannot form its collective again in a live process"
    stop_after_peer_failure_s = STOP_AFTER_PEER_FAILURE_S  # an all-reduce a peer left waits for it for ever

    def __init__(self) -> None:
        self._clusters: "collections.OrderedDict[Tuple[str, ...], List[Dict[str, Any]]]" = collections.OrderedDict()

    def cluster(self, workers: Sequence[Any], local: bool) -> List[Dict[str, Any]]:
        """Each rank's ``TF_CONFIG`` for these worker processes (the same every time they are asked)."""
        key = _process_key(workers)
        if key not in self._clusters:
            ports = get_within([w.actor.free_port.remote() for w in workers], PORTS_S,
                               "every rank to pick a free port for TensorFlow's server", log=logger,
                               labels=[f"rank {i}" for i in range(len(workers))])
            hosts = [LOOPBACK if local else w.info.get("node_ip", LOOPBACK) for w in workers]
            addresses = [f"{h}:{p}" for h, p in zip(hosts, ports)]
            self._clusters[key] = [{"cluster": {"worker": addresses}, "task": {"type": "worker", "index": i}}
                                   for i in range(len(workers))]
            while len(self._clusters) > REMEMBERED:
                self._clusters.popitem(last=False)
        return self._clusters[key]

    @contextlib.contextmanager
    def driver_cell(self, workers: Sequence[Any], local: bool) -> Iterator[List[Any]]:
        yield self.cluster(workers, local)

    @contextlib.contextmanager
    def worker_cell(self, spec: Any) -> Iterator[None]:
        set_tf_config(spec)
        yield

    def training_steps(self, namespace: Dict[str, Any]) -> int:
        """The step counters of the Keras models' optimizers bound to names (``model.fit`` advances them)."""
        total = 0
        for _, obj in walk(namespace, is_keras_model):
            if is_keras_model(obj):
                try:
                    total += int(obj.optimizer.iterations.numpy())
                except Exception:  # noqa: BLE001 - not compiled, or no optimizer: it has not trained
                    continue
        return total


def set_tf_config(spec: Dict[str, Any]) -> None:
    """Set ``TF_CONFIG`` (and the legacy Keras, unless chosen otherwise) in this worker process."""
    os.environ["TF_CONFIG"] = json.dumps(spec)
    os.environ.setdefault(LEGACY_KERAS, "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # TensorFlow's C++ INFO lines (servers, barriers) stay out


TENSORFLOW = TensorflowBackend()
