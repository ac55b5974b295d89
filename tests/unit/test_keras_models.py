"""Keras models in snapshots (worker/keras_models.py): recognised by class name, saved as tensors, loaded in place."""
from __future__ import annotations

import numpy as np
import pytest

from raytrain_nb._internal.worker import keras_models, snapshot


class _Var:
    def __init__(self, value):
        self.value = np.array(value, dtype="float32")

    def numpy(self):
        return self.value

    def assign(self, value):
        self.value = np.array(value, dtype="float32")


class _Optimizer:
    """Keras 2's optimizer: ``variables()`` is a method; ``build`` makes the slots on first use."""

    def __init__(self):
        self.vars = [_Var(0)]

    def variables(self):
        return self.vars

    def build(self, var_list):
        self.vars = [_Var(0)] + [_Var(np.zeros_like(v.value)) for v in var_list]


def _keras_class(module: str):
    model = type("Model", (), {"__module__": module})

    class Sequential(model):
        def __init__(self, shapes):
            self.weights_ = [_Var(np.full(s, 1.0)) for s in shapes]
            self.optimizer = _Optimizer()
            self.distribute_strategy = None

        @property
        def trainable_variables(self):
            return self.weights_

        def get_weights(self):
            return [w.value.copy() for w in self.weights_]

        def set_weights(self, values):
            for w, v in zip(self.weights_, values):
                w.assign(v)

    return Sequential


@pytest.mark.parametrize("module", ["tf_keras.src.engine.training", "keras.src.models.model"])
def test_keras_models_are_recognised_by_class_name(module):
    klass = _keras_class(module)
    assert keras_models.is_keras_model(klass([(2,)]))
    assert not keras_models.is_keras_model(klass)  # the class itself is not a model
    assert not keras_models.is_keras_model(_keras_class("mylib.models")([(2,)]))


def test_state_round_trips_into_the_same_model_and_builds_an_optimizer_that_has_not_trained():
    klass = _keras_class("tf_keras.src.engine.training")
    model = klass([(2, 3), (3,)])
    model.optimizer.build(model.trainable_variables)
    model.set_weights([np.full((2, 3), 7.0), np.full((3,), -1.0)])
    for i, v in enumerate(model.optimizer.vars):
        v.assign(np.full(v.value.shape, float(i)))
    state = keras_models.model_state(model)
    assert [tuple(t.shape) for t in state["weights"]] == [(2, 3), (3,)] and len(state["optimizer"]) == 3

    replayed = klass([(2, 3), (3,)])  # compiled in a replayed cell: its optimizer has only its step counter
    assert keras_models.structure_problem(replayed, state) is None
    keras_models.load_model_state(replayed, state)
    assert (replayed.get_weights()[0] == 7.0).all() and (replayed.get_weights()[1] == -1.0).all()
    assert [float(v.value.flat[0]) if v.value.size else float(v.value) for v in replayed.optimizer.vars] == [0, 1, 2]


def test_a_different_structure_is_named_before_anything_loads():
    klass = _keras_class("tf_keras.src.engine.training")
    state = keras_models.model_state(klass([(2, 3)]))
    other = klass([(4, 3)])
    assert keras_models.structure_problem(other, state) == "weight array 0 has shape (2, 3) saved but (4, 3) here"
    assert keras_models.structure_problem(klass([(2, 3), (3,)]), state) == "1 weight arrays saved but 2 here"
    assert snapshot.structure_problem("keras", other, state) is not None


def test_a_namespace_tracks_keras_models_by_name():
    model = _keras_class("tf_keras.src.engine.training")([(2,)])
    tracked = snapshot.find_tracked({"model": model, "box": {"net": model}})
    assert tracked.keras == {"model": model}  # the shortest path names it
    assert snapshot.kind_of(model) == "keras"
