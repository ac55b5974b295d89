"""The worker's ``TrainContext`` (Ray Train's): where this worker stands in the group."""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, Dict, List

from ..validate import not_supported

#: What ``get_metadata()`` returns: set by the session module (it imports this one) to read the session's.
METADATA: List[Callable[[], Dict[str, Any]]] = [dict]


@dataclasses.dataclass(frozen=True)
class TrainContext:
    """Where this worker stands in the group (Ray Train's ``TrainContext``)."""

    world_rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    experiment_name: str = ""

    def get_world_rank(self) -> int:
        """This worker's rank in the group, 0..world_size-1."""
        return self.world_rank

    def get_world_size(self) -> int:
        """Number of workers in the group."""
        return self.world_size

    def get_local_rank(self) -> int:
        """This worker's rank among the workers on its node."""
        return self.local_rank

    def get_local_world_size(self) -> int:
        """Number of workers on this worker's node."""
        return self.local_world_size

    def get_node_rank(self) -> int:
        """Index of this worker's node among the group's nodes."""
        return self.node_rank

    def get_experiment_name(self) -> str:
        """The run's name."""
        return self.experiment_name

    def get_trial_name(self) -> str:
        """The run's name (Ray Train V2 refuses this Tune-era method; here it names the run)."""
        return self.experiment_name

    def get_metadata(self) -> Dict[str, Any]:
        """The trainer's ``metadata=`` dict (``{}`` in a notebook cell); Ray Train V2 refuses this method."""
        return METADATA[0]()

    def get_storage(self) -> Any:
        """Ray Train's ``StorageContext`` (a developer API): not supported.

        Raises:
            NotSupportedError: naming where the run's files are.
        """
        raise not_supported("get_context().get_storage() (Ray Train's StorageContext)", "the run directory is "
                            "<storage_path>/<name> of the RunConfig; pass what the loop needs in train_loop_config")

    def get_trial_id(self) -> str:
        """A Ray Tune trial's id: refused, as Ray Train V2 does.

        Raises:
            NotSupportedError: naming ``train_loop_config``.
        """
        raise not_supported("get_context().get_trial_id()", TRIAL_HINT)

    def get_trial_dir(self) -> str:
        """A Ray Tune trial's directory: refused, as Ray Train V2 does.

        Raises:
            NotSupportedError: naming ``train_loop_config``.
        """
        raise not_supported("get_context().get_trial_dir()", TRIAL_HINT)

    def get_trial_resources(self) -> Any:
        """A Ray Tune trial's resources: refused, as Ray Train V2 does.

        Raises:
            NotSupportedError: naming ``train_loop_config``.
        """
        raise not_supported("get_context().get_trial_resources()", TRIAL_HINT)


#: The way out of Tune's trial methods on a worker (Ray Train V2's advice).
TRIAL_HINT = ("a trainer's workers are not a Tune trial; pass what the loop needs (a directory, the resources) in "
              "train_loop_config")
