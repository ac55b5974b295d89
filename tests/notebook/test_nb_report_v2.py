"""Ray Train V2's report() options in %%distributed cells of a real kernel: named ASYNC checkpoints, validation by
the group's function (``group.validation(fn)``), get_all_reported_checkpoints(), and one-line errors."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.notebook

SETUP = "import os, tempfile, raytrain_nb as train\nrank = train.get_context().get_world_rank()"
SCORE = """\
def score(checkpoint, scale=1.0):
    import os
    with checkpoint.as_directory() as d:
        return {"val": scale * len([f for f in os.listdir(d) if not f.startswith(".")])}
_rt.active_group().validation(score, train.ValidationTaskConfig(fn_kwargs={"scale": 10.0}))
"""
CELL = """\
%%distributed
for epoch in range(2):
    d = tempfile.mkdtemp()
    open(os.path.join(d, f"r{rank}.txt"), "w").close()
    train.report({"epoch": epoch}, checkpoint=train.Checkpoint.from_directory(d), checkpoint_dir_name=f"cell_{epoch}",
                 checkpoint_upload_mode=train.CheckpointUploadMode.ASYNC, validation=True)
got = [(os.path.basename(r.checkpoint.path), r.status.name, r.metrics["val"])
       for r in train.get_all_reported_checkpoints(timeout_s=120)]
kept = os.path.exists(d)  # after the uploads (get_all_reported_checkpoints waited for them)
"""


def test_a_cell_reports_named_async_checkpoints_that_the_groups_function_validates(kernel):
    kernel.ensure_group(SETUP)
    kernel.ok("import raytrain_nb as _rt, raytrain_nb as train\n" + SCORE)
    kernel.ok(CELL)
    assert kernel.ok("%dist_pull got\ngot").value == "[('cell_0', 'VALIDATED', 20.0), ('cell_1', 'VALIDATED', 20.0)]"
    assert kernel.ok("%dist_pull kept --all\nkept").value == "[False, False]"  # ASYNC deleted the local copies
    used = kernel.run("%%distributed\ntrain.report({}, checkpoint=train.Checkpoint.from_directory(tempfile.mkdtemp()),"
                      " checkpoint_dir_name='cell_1')")
    assert used.status == "error" and "checkpoint_dir_name='cell_1'" in used.error_text, used.describe()
    assert "that name already" in used.error_text
