"""Keras models in snapshots: the weights and the optimizer's variables, as tensors, loaded back into the same
model (``set_weights`` and ``assign``, which keep every reference the user holds valid).

The legacy Keras 2 (``tf_keras``, which the ``tensorflow`` backend selects) and Keras 3 are both recognised by
class name, so neither TensorFlow nor Keras is imported here. The values are kept as torch tensors, so a
snapshot of a Keras model loads with ``weights_only=True`` like every other tracked object.
"""
from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Optional

#: The modules whose ``Model`` class (and subclasses: ``Sequential``, functional models) is a Keras model.
_KERAS_MODULES = ("tf_keras", "keras", "tensorflow")


def is_keras_model(obj: Any) -> bool:
    """A Keras ``Model`` (Keras 2 from ``tf_keras`` or ``tf.keras``, or Keras 3); never a class."""
    if isinstance(obj, type):
        return False
    for klass in type(obj).__mro__:
        if klass.__qualname__ == "Model" and (klass.__module__ or "").split(".", 1)[0] in _KERAS_MODULES:
            return hasattr(obj, "get_weights") and hasattr(obj, "set_weights")
    return False


def _optimizer_variables(model: Any) -> Optional[List[Any]]:
    """The variables of the model's optimizer (Keras 2's ``variables()`` is a method, Keras 3's a list);
    None when the model was not compiled with one."""
    optimizer = getattr(model, "optimizer", None)
    if optimizer is None:
        return None
    variables = getattr(optimizer, "variables", None)
    if callable(variables):
        variables = variables()
    return list(variables) if variables is not None else None


def _tensor(value: Any) -> Any:
    import numpy as np  # numpy: optional or heavy, loaded on first use
    import torch  # torch: loaded on first use, not on import raytrain_nb

    return torch.from_numpy(np.array(value, copy=True))


def model_state(model: Any) -> Dict[str, Any]:
    """``{"weights": [tensor...], "optimizer": [tensor...]}``: the model's weights and, once its optimizer has
    made its variables (after the first training step), their values."""
    state: Dict[str, Any] = {"weights": [_tensor(w) for w in model.get_weights()]}
    variables = _optimizer_variables(model)
    if variables:
        state["optimizer"] = [_tensor(v.numpy()) for v in variables]
    return state


def structure_problem(model: Any, state: Dict[str, Any]) -> Optional[str]:
    """How ``state`` does not fit ``model`` (the number and shapes of its weights), or None."""
    live = [tuple(w.shape) for w in model.get_weights()]
    saved = [tuple(w.shape) for w in state.get("weights", ())]
    if len(live) != len(saved):
        return f"{len(saved)} weight arrays saved but {len(live)} here"
    for i, (a, b) in enumerate(zip(saved, live)):
        if a != b:
            return f"weight array {i} has shape {a} saved but {b} here"
    return None


def _build_optimizer(model: Any, count: int) -> List[Any]:
    """The optimizer's variables, made first when it has not trained yet (a model compiled in a cell that was
    replayed): ``build`` on the trainable weights, inside the model's distribution strategy."""
    variables = _optimizer_variables(model) or []
    if len(variables) == count or not hasattr(model.optimizer, "build"):
        return variables
    strategy = getattr(model, "distribute_strategy", None)
    with strategy.scope() if strategy is not None else contextlib.nullcontext():
        model.optimizer.build(model.trainable_variables)
    return _optimizer_variables(model) or []


def load_model_state(model: Any, state: Dict[str, Any]) -> None:
    """Load ``state`` into ``model`` in place: its weights, then its optimizer's variables (made first when
    the optimizer has not trained yet).

    Raises:
        ValueError: the optimizer's variables differ in number from the saved ones.
    """
    model.set_weights([w.numpy() for w in state["weights"]])
    saved = state.get("optimizer")
    if not saved:
        return
    variables = _build_optimizer(model, len(saved))
    if len(variables) != len(saved):
        raise ValueError(f"the optimizer has {len(variables)} variables here but {len(saved)} were saved: "
                         "compile the model with the optimizer it was saved with")
    for variable, value in zip(variables, saved):
        variable.assign(value.numpy())
