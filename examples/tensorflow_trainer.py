"""Ray Train's TensorflowTrainer docstring example, then ``FailureConfig(max_failures=1)`` with a worker killed
mid-training: every rank starts afresh (TensorFlow cannot form its collective again in a live process) and the
training function resumes from the newest checkpoint.

Written for Ray Train (``ray.train``); runs on raytrain_nb after changing only the imports (``ray.train`` ->
``raytrain_nb``, ``ray.train.tensorflow`` -> ``raytrain_nb.tensorflow``). With TensorFlow 2.16+ it needs the
legacy Keras 2 (``tf-keras``), which both set up on the workers (``TF_USE_LEGACY_KERAS=1``).
"""
import os
import signal
import tempfile

import tensorflow as tf

import ray
from ray import train
from ray.train import Checkpoint, FailureConfig, RunConfig, ScalingConfig
from ray.train.tensorflow import TensorflowTrainer


def build_model():
    # toy neural network : 1-layer
    return tf.keras.Sequential(
        [tf.keras.layers.Dense(
            1, activation="linear", input_shape=(1,))]
    )


def train_loop_per_worker(config):
    dataset_shard = train.get_dataset_shard("train")
    strategy = tf.distribute.experimental.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = build_model()
        model.compile(
            optimizer="Adam", loss="mean_squared_error", metrics=["mse"])

    tf_dataset = dataset_shard.to_tf(
        feature_columns="x",
        label_columns="y",
        batch_size=1,
    )
    for epoch in range(config["num_epochs"]):
        model.fit(tf_dataset)

        # Create checkpoint.
        checkpoint_dir = tempfile.mkdtemp()
        model.save_weights(
            os.path.join(checkpoint_dir, "my_checkpoint")
        )
        checkpoint = Checkpoint.from_directory(checkpoint_dir)

        train.report(
            {},
            checkpoint=checkpoint,
        )


train_dataset = ray.data.from_items([{"x": x, "y": x + 1} for x in range(32)])
trainer = TensorflowTrainer(
    train_loop_per_worker=train_loop_per_worker,
    scaling_config=ScalingConfig(num_workers=3, use_gpu=False),
    datasets={"train": train_dataset},
    train_loop_config={"num_epochs": 2},
)
result = trainer.fit()
assert result.error is None and result.checkpoint is not None, result
print(f"docstring example: {len(result.best_checkpoints)} checkpoint(s), last {result.checkpoint}")


# Fault tolerance: rank 1 kills its own process in the second epoch of the first attempt (a marker file says
# it happened once). The second attempt starts in fresh processes and resumes after the newest checkpoint.
def fault_tolerant_loop(config):
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Dense(1, input_shape=(1,))])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.01), loss="mse")
    start = 0
    checkpoint = train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path:
            model.load_weights(os.path.join(path, "weights"))
            start = int(open(os.path.join(path, "epoch")).read()) + 1
    x = tf.range(64, dtype=tf.float32)[:, None] / 64
    data = tf.data.Dataset.from_tensor_slices((x, 2 * x + 1)).batch(16)
    for epoch in range(start, config["num_epochs"]):
        if epoch == 2 and train.get_context().get_world_rank() == 1 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        history = model.fit(data, epochs=1, verbose=0)
        with tempfile.TemporaryDirectory() as tmp:
            model.save_weights(os.path.join(tmp, "weights"))
            with open(os.path.join(tmp, "epoch"), "w") as fh:
                fh.write(str(epoch))
            train.report({"epoch": epoch, "loss": history.history["loss"][-1], "start": start},
                         checkpoint=Checkpoint.from_directory(tmp))


marker = os.path.join(tempfile.mkdtemp(), "killed-once")
trainer = TensorflowTrainer(
    fault_tolerant_loop,
    train_loop_config={"num_epochs": 4, "marker": marker},
    scaling_config=ScalingConfig(num_workers=2),
    run_config=RunConfig(failure_config=FailureConfig(max_failures=1)),
)
result = trainer.fit()
assert os.path.exists(marker), "rank 1 was never killed"
assert result.error is None, result.error
assert result.metrics["epoch"] == 3 and result.metrics["start"] == 2, result.metrics
print(f"fault tolerance: resumed at epoch {result.metrics['start']}, final loss {result.metrics['loss']:.4f}")
