"""The dashboard's checkpoint list shows a reported checkpoint still uploading and each one's validation."""
from __future__ import annotations

from types import SimpleNamespace

from raytrain_nb._internal.checkpoint import reported
from raytrain_nb._internal.checkpoint.run_storage import RunStorage
from raytrain_nb.notebook.dashboard.actions import checkpoint_rows, entry_label


def test_an_upload_under_way_is_a_row_until_committed_and_validation_shows_on_the_label(tmp_path):
    run = RunStorage(str(tmp_path), "rows")
    try:
        local = tmp_path / "local"
        local.mkdir()
        (local / "w.bin").write_bytes(b"w")
        staged = reported.report_staging(run.url, reported.report_name(1), "epoch_0")
        reported.upload(staged, 0, str(local), {"epoch": 0}, world_size=2)  # rank 1 has not reported yet
        group = SimpleNamespace(run_storage=run, checkpoints=lambda: run.manager.list())
        rows = checkpoint_rows(group)
        assert [entry_label(r) for r in rows] == ["epoch_0 · reported · uploading…"]
        record = {"rank": 0, "report": reported.report_name(1), "checkpoint": True, "time": 0.0,
                  "metrics": {"epoch": 0}, "dir": "epoch_0", "validation": {"fn_kwargs": None, "timeout_s": None}}
        run.on_records([record, dict(record, rank=1, checkpoint=False)], world_size=2)
        rows = checkpoint_rows(group)
        assert len(rows) == 1 and "validating…" in entry_label(rows[0]) and "uploading" not in entry_label(rows[0])
        run.manager.update("epoch_0", {"val": 0.5}, {"status": "validated"})
        label = entry_label(checkpoint_rows(group)[0])
        assert "val=0.5" in label and "validated" in label, label
        assert run.manager.by_report(1).name == "epoch_0" and run.manager.latest("reported").report == 1
    finally:
        run.close()
