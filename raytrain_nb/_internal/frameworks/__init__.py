"""What runs in a worker for Transformers, Lightning and Accelerate, on the group's process group."""
