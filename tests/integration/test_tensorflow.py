"""TensorFlow: Ray Train's TensorflowTrainer docstring example runs after changing only its imports (then a
worker killed mid-training, every rank started afresh, resumed from the newest checkpoint), and a
``backend="tensorflow"`` group gives every rank ``TF_CONFIG`` and the legacy Keras 2, so a
``MultiWorkerMirroredStrategy`` created in a cell spans the group and ``model.fit`` in later cells trains
one model over every rank's data."""
from __future__ import annotations

import importlib.util
import re
import runpy
import time
import subprocess
import sys
from pathlib import Path

import pytest

from raytrain_nb._internal.worker.framework import STOP_AFTER_PEER_FAILURE_S

from ..groups import assert_ranks_identical, quiet, same_state
from .test_examples import port

# Looked up, not imported: the test lane that runs this module loads TensorFlow when its tests run (the example,
# in this process); the other lane never does.
if importlib.util.find_spec("tensorflow") is None:
    pytest.skip("tensorflow is not installed: pip install 'raytrain_nb[tensorflow]'", allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "tensorflow_trainer.py"

SETUP = """
import json, os
import numpy as np
import tensorflow as tf
import raytrain_nb as train
from raytrain_nb.tensorflow.keras import ReportCheckpointCallback

strategy = tf.distribute.MultiWorkerMirroredStrategy()  # the first cell: before any other TensorFlow operation
with strategy.scope():
    model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])
    model.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss="mse")
rank = train.get_context().get_world_rank()
x = np.random.default_rng(rank).normal(size=(64, 2)).astype("float32")  # each rank its own data
y = x @ np.array([[2.0], [-1.0]], dtype="float32") + 0.5
options = tf.data.Options()
options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
data = tf.data.Dataset.from_tensor_slices((x, y)).batch(16).with_options(options)
"""


@pytest.fixture(scope="module")
def tf_group(ray_session):
    from raytrain_nb import WorkerGroup

    group = WorkerGroup(2, backend="tensorflow")
    try:
        quiet(group, SETUP)
        yield group
    finally:
        group.shutdown()


def _value(result, rank: int) -> str:
    return result.values[rank][0]["text/plain"]


@pytest.mark.scripts
def test_example_runs_after_the_import_change_and_a_failure_restarts_every_rank(ray_session, tmp_path, capsys):
    source = EXAMPLE.read_text()
    ported = port(source)
    changed = [(a, b) for a, b in zip(source.splitlines(), ported.splitlines()) if a != b]
    assert [b for _, b in changed] == ["import raytrain_nb as train",
                                       "from raytrain_nb import Checkpoint, FailureConfig, RunConfig, ScalingConfig",
                                       "from raytrain_nb.tensorflow import TensorflowTrainer"]
    assert "ray.train" not in ported.split('"""', 2)[2]
    path = tmp_path / EXAMPLE.name
    path.write_text(ported)
    runpy.run_path(str(path), run_name="__main__")  # asserts the checkpoints and where the second run resumed
    out = capsys.readouterr()
    assert "docstring example: 2 checkpoint(s)" in out.out, out.out[-3000:]
    assert "fault tolerance: resumed at epoch 2" in out.out, out.out[-3000:]
    assert re.search(r"restart 1/1: rank\(s\) 1 died.*; fresh processes for every rank \(TensorflowTrainer: "
                     r"TensorFlow cannot form its collective again in a live process\)", out.err), out.err[-3000:]


def test_every_rank_gets_its_tf_config_and_the_legacy_keras(tf_group):
    result = quiet(tf_group, "spec = json.loads(os.environ['TF_CONFIG'])\n"
                             "(spec['task'], len(spec['cluster']['worker']), tf.keras.layers.Dense.__module__.split('.')[0], "
                             "os.environ['TF_USE_LEGACY_KERAS'])")
    assert _value(result, 0) == "({'type': 'worker', 'index': 0}, 2, 'tf_keras', '1')"
    assert _value(result, 1) == "({'type': 'worker', 'index': 1}, 2, 'tf_keras', '1')"
    again = quiet(tf_group, "os.environ['TF_CONFIG'] == json.dumps(spec)")  # the same cluster in every cell
    assert [_value(again, r) for r in (0, 1)] == ["True", "True"]


def test_fit_in_cells_trains_one_model_over_every_ranks_data_and_reports_checkpoints(tf_group):
    from raytrain_nb.tensorflow import TensorflowCheckpoint

    reported = len(tf_group.checkpoints("reported"))
    quiet(tf_group, "before = model.evaluate(data, verbose=0)\n"
                    "history = model.fit(data, epochs=3, verbose=0, callbacks=[ReportCheckpointCallback()])\n"
                    "weights, losses = model.get_weights(), history.history['loss']")
    first, second = tf_group.pull("weights", rank=None)
    # different data on each rank: equal weights mean the gradients were averaged
    assert_ranks_identical([first, second], "weights")
    losses = tf_group.pull("losses", rank=None)
    assert losses[0] == losses[1] and losses[0][-1] < losses[0][0] < tf_group.pull("before"), losses
    # the callback reported a checkpoint per epoch; the newest holds the model every rank has now
    entries = tf_group.checkpoints("reported")
    assert len(entries) == reported + 3
    # with Keras's logs of the epoch (Keras passes them by position)
    assert [round(e.metrics["loss"], 5) for e in entries[-3:]] == [round(v, 5) for v in losses[0]], entries[-3:]
    loaded = TensorflowCheckpoint(entries[-1].checkpoint.path).get_model()
    assert same_state(loaded.get_weights(), first)


def _state(group):
    """Each rank's weights and optimizer step count."""
    quiet(group, "now = (model.get_weights(), int(model.optimizer.iterations.numpy()))")
    return group.pull("now", rank=None)


def test_keras_models_snapshot_and_roll_back_into_the_same_object(tf_group):
    quiet(tf_group, "model.fit(data, epochs=1, verbose=0)\nsame = model")
    saved = _state(tf_group)
    assert_ranks_identical(saved, "weights and step count")
    assert saved[0][1] > 0
    tf_group.checkpoint("keras_one_epoch")
    quiet(tf_group, "model.fit(data, epochs=2, verbose=0)")
    assert not same_state(_state(tf_group)[0], saved[0])
    assert "model" in tf_group.rollback("keras_one_epoch").restored
    back = _state(tf_group)
    assert same_state(back, saved)  # every rank's weights and optimizer step count
    assert _value(quiet(tf_group, "same is model"), 0) == "True"


def test_a_rank_that_raises_in_the_collective_is_stopped_and_restart_and_rescale_start_fresh_processes(tf_group,
                                                                                                     monkeypatch):
    from raytrain_nb import WorkerError
    from raytrain_nb._internal.frameworks.tensorflow_backend import TENSORFLOW

    assert TENSORFLOW.stop_after_peer_failure_s == STOP_AFTER_PEER_FAILURE_S == 15.0  # the stated default
    monkeypatch.setattr(TENSORFLOW, "stop_after_peer_failure_s", 5.0)  # the driver reads it: a shorter wait here
    stop_s = TENSORFLOW.stop_after_peer_failure_s

    quiet(tf_group, "pid, tf_config, held = os.getpid(), os.environ['TF_CONFIG'], model.get_weights()")
    pids, configs = tf_group.pull("pid", rank=None), tf_group.pull("tf_config", rank=None)
    started = time.monotonic()
    with pytest.raises(WorkerError) as info:  # rank 0 waits in fit's first all-reduce for a peer that left
        quiet(tf_group, "if rank == 1:\n    raise ValueError('rank 1 fails before training')\n"
                        "model.fit(data, epochs=1, verbose=0)")
    assert time.monotonic() - started < stop_s + 30
    assert "rank 1 fails before training" in str(info.value) and info.value.ranks == [0, 1]
    assert f"stopped by raytrain_nb: still running {stop_s:g} s after rank(s) 1 failed, " \
           "inside the tensorflow collective" in str(info.value)
    held = tf_group.pull("held", rank=1)  # rank 1 raised before training: its model is as it was
    assert tf_group.restart() == [0]
    # every rank in a fresh process, with a new cluster; the setup cell replayed, the state of rank 1 loaded
    assert all(a != b for a, b in zip(pids, _pids(tf_group)))
    quiet(tf_group, "tf_config = os.environ['TF_CONFIG']")
    assert tf_group.pull("tf_config", rank=0) != configs[0]
    for weights in (s[0] for s in _state(tf_group)):
        assert same_state(weights, held)
    quiet(tf_group, "model.fit(data, epochs=1, verbose=0)")  # the replayed strategy spans both new processes
    after = _state(tf_group)
    assert_ranks_identical(after, "weights and step count")
    assert not same_state(after[0][0], held)
    tf_group.rescale(1)
    assert _value(quiet(tf_group, "strategy.num_replicas_in_sync"), 0) == "1"
    assert same_state(_state(tf_group)[0], after[0])
    tf_group.rescale(2)
    quiet(tf_group, "model.fit(data, epochs=1, verbose=0)")
    again = _state(tf_group)
    assert_ranks_identical(again, "weights and step count")
    assert _value(quiet(tf_group, "strategy.num_replicas_in_sync"), 1) == "2"


def _pids(group):
    quiet(group, "pid = os.getpid()")
    return group.pull("pid", rank=None)


def test_a_missing_tensorflow_is_named_with_its_pip_install():
    code = "import sys; sys.modules['tensorflow'] = None\nimport raytrain_nb.tensorflow"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines()[-1] == ("ImportError: tensorflow is not installed: "
                                                    "pip install 'raytrain_nb[tensorflow]'")


def test_a_second_strategy_in_a_later_cell_joins_the_same_cluster(tf_group):
    # TensorFlow configures its collective once per process, from TF_CONFIG as the first strategy found it;
    # the group gives every cell the same TF_CONFIG, so a strategy made again (a re-run setup cell) is over the
    # same workers and a model built in its scope trains across them.
    quiet(tf_group, "again = tf.distribute.MultiWorkerMirroredStrategy()\n"
                    "with again.scope():\n"
                    "    model2 = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(2,))])\n"
                    "    model2.compile(optimizer=tf.keras.optimizers.SGD(0.05), loss='mse')\n"
                    "model2.fit(data, epochs=1, verbose=0)\n"
                    "weights2, workers = model2.get_weights(), again.num_replicas_in_sync")
    assert tf_group.pull("workers", rank=None) == [2, 2]
    assert_ranks_identical(tf_group.pull("weights2", rank=None), "weights of the second model")
