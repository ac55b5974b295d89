"""Ray Tune's own start of Ray (``Tuner.fit()`` before anything else started it) starts the embedded instance."""
from __future__ import annotations

import sys
import types

import ray

from raytrain_nb._internal.train import autoinit


def test_tunes_own_ray_init_starts_the_embedded_instance(monkeypatch):
    calls = []
    fake = types.ModuleType("ray.tune.tune")
    fake._ray_auto_init = lambda entrypoint: calls.append(("tune", entrypoint))
    monkeypatch.setitem(sys.modules, "ray.tune.tune", fake)
    monkeypatch.setattr(autoinit.cluster, "connect", lambda: calls.append(("ours", None)))
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.delenv("TUNE_DISABLE_AUTO_INIT", raising=False)
    autoinit.install()
    autoinit.install()  # a second install wraps nothing twice
    fake._ray_auto_init("Tuner.fit()")
    assert calls == [("ours", None), ("tune", "Tuner.fit()")]
    monkeypatch.setenv("TUNE_DISABLE_AUTO_INIT", "1")  # Tune's switch still turns it off
    calls.clear()
    fake._ray_auto_init("Tuner.fit()")
    assert calls == [("tune", "Tuner.fit()")]
