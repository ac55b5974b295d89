"""The actor side of the worker group: the Ray actor, its cell thread, cell semantics and the worker-side API."""
