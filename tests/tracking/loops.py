"""The training loop of the tracking tests (pickled by value): a step every ``pause`` seconds, each reported with
rank 0's checkpoint of the step; rank 1 kills its process after its report of ``kill_at`` once (the marker)."""
from __future__ import annotations

import json
import os
import signal
import tempfile
import time
from typing import Any, Dict

import raytrain_nb as train
from raytrain_nb import Checkpoint


def loop(config: Dict[str, Any]) -> None:
    start = 0
    ckpt = train.get_checkpoint()
    if ckpt is not None:
        with ckpt.as_directory() as d:
            with open(os.path.join(d, "step.json")) as f:
                start = json.load(f)["step"] + 1
    rank = train.get_context().get_world_rank()
    for step in range(start, config["steps"]):
        time.sleep(config.get("pause", 0.3))  # the driver polls in between: every report reaches it
        with tempfile.TemporaryDirectory() as d:
            if rank == 0:
                with open(os.path.join(d, "step.json"), "w") as f:
                    json.dump({"step": step}, f)
            train.report({"step": step, "loss": 1.0 / (step + 1) + rank},
                         checkpoint=Checkpoint.from_directory(d) if rank == 0 else None)
        marker = config.get("marker")
        if marker and step == config.get("kill_at") and rank == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
