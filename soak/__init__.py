"""Chaos soak of raytrain_nb: ``python -m soak.chaos --duration 120 --seed 7`` (see :mod:`soak.chaos`)."""
