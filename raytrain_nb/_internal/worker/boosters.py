"""Gradient-boosted models in snapshots: XGBoost's and LightGBM's ``Booster`` as their model bytes, loaded back
into the same objects (``load_model`` / ``model_from_string``, which replace a booster's model in place)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple


def _xgb_save(booster: Any) -> bytes:
    return bytes(booster.save_raw(raw_format="ubj"))


def _xgb_load(booster: Any, data: bytes) -> None:
    booster.load_model(bytearray(data))


def _lgb_save(booster: Any) -> bytes:
    return booster.model_to_string(num_iteration=-1).encode()


def _lgb_load(booster: Any, data: bytes) -> None:
    booster.model_from_string(data.decode())


#: class (module.qualname) -> (model bytes of a booster, load bytes into a booster in place)
BOOSTERS: Dict[str, Tuple[Callable[[Any], bytes], Callable[[Any, bytes], None]]] = {
    "xgboost.core.Booster": (_xgb_save, _xgb_load),
    "lightgbm.basic.Booster": (_lgb_save, _lgb_load),
}


def _entry(obj: Any) -> Optional[Tuple[Callable[[Any], bytes], Callable[[Any, bytes], None]]]:
    for klass in type(obj).__mro__:
        entry = BOOSTERS.get(f"{klass.__module__}.{klass.__qualname__}")
        if entry is not None:
            return entry
    return None


def is_booster(obj: Any) -> bool:
    """An XGBoost or LightGBM ``Booster`` (checked by class name: neither library is imported)."""
    return not isinstance(obj, type) and _entry(obj) is not None


def model_bytes(booster: Any) -> bytes:
    """The booster's saved model (XGBoost: UBJSON; LightGBM: its model text)."""
    return _entry(booster)[0](booster)


def load_into(booster: Any, data: bytes) -> None:
    """Replace ``booster``'s model with the saved ``data`` (the same object: references stay valid)."""
    _entry(booster)[1](booster, bytes(data))
