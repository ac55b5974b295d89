"""The driver side of the worker group: lifecycle, state machine, slot table, running cells, recovery."""
