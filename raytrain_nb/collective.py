"""Collectives across the ranks of a group or a trainer's workers, mirroring ``ray.train.collective``.

``barrier()`` waits until every rank called it; ``broadcast_from_rank_zero(data)`` returns rank 0's ``data`` on every
rank. Both work on every backend (no ``torch.distributed`` process group is needed), in ``%%distributed`` cells,
``WorkerGroup.run`` / ``execute`` and a trainer's training function, and fail within
``RAYTRAIN_NB_COLLECTIVE_TIMEOUT_S`` (1800 s) naming the ranks that did not arrive.
"""
from ._internal.worker.collective import barrier, broadcast_from_rank_zero

__all__ = ["broadcast_from_rank_zero", "barrier"]

broadcast_from_rank_zero.__module__ = __name__
barrier.__module__ = __name__
