"""Optional dependencies: import one, or fail in one line that names the ``pip install`` that fixes it."""
from __future__ import annotations

import importlib
from types import ModuleType

# module to import -> the extra of raytrain_nb that installs it
EXTRAS = {
    "transformers": "transformers",
    "accelerate": "accelerate",
    "lightning": "lightning",
    "ray.tune": "tune",
    "pandas": "data",
    "xgboost": "xgboost",
    "lightgbm": "lightgbm",
    "tensorflow": "tensorflow",
    "tf_keras": "tensorflow",
    "sklearn": "tutorials",
}


def require(module: str, extra: str = "") -> ModuleType:
    """Import ``module`` (an optional dependency) or raise ``ImportError`` naming the extra that installs it.

    Example: ``transformers = require("transformers")``.
    """
    extra = extra or EXTRAS.get(module, "") or module.split(".")[0]
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        if exc.name is not None and module.split(".")[0] != exc.name.split(".")[0] and exc.name != module:
            raise  # the library is there but something it needs is broken: its own message is the right one
        raise ImportError(f"{module} is not installed: pip install 'raytrain_nb[{extra}]'",
                          name=exc.name) from None
