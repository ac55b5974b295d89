"""Internals, by concern: group/ (driver), worker/ (actor), checkpoint/ (storage), train/ (trainers); see ARCHITECTURE.md."""
