"""Snapshot files in storage: ``--allow-pickle`` loosens only ``vars.pt``; weights never unpickle code (no Ray)."""
from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")

from raytrain_nb._internal.checkpoint.staging import begin_dir, commit_dir  # noqa: E402
from raytrain_nb._internal.errors import SnapshotError  # noqa: E402
from raytrain_nb._internal.worker import snapshot, snapshot_io  # noqa: E402

RAN = []


@dataclasses.dataclass
class Custom:
    """A plain variable that only loads by unpickling (its class is not on torch's allow-list)."""

    value: int


def _mark() -> str:
    RAN.append("code ran")
    return "pwned"


class Boom:
    """Unpickling it runs :func:`_mark`."""

    def __reduce__(self):
        return (_mark, ())


def namespace():
    torch.manual_seed(0)
    model = torch.nn.Linear(2, 2)
    return {"model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1), "lr": 0.1, "custom": Custom(3)}


def write_snapshot(run, name, ns, var_names):
    staged = begin_dir(run, name)
    snapshot_io.write(snapshot_io.take(ns, 0, 1, var_names), staged)
    commit_dir(staged)
    return staged


def test_plain_variables_go_to_their_own_file(tmp_path):
    ns = namespace()
    staged = write_snapshot(str(tmp_path), "snap", ns, ["lr"])
    assert torch.load(f"{staged.final_path}/{snapshot_io.VARS}", weights_only=True) == {"lr": 0.1}
    assert "vars" not in torch.load(f"{staged.final_path}/{snapshot_io.REPLICATED}", weights_only=True)
    ns["lr"] = 9.0
    with torch.no_grad():
        ns["model"].weight.zero_()
    out = snapshot_io.load(ns, staged.final_url, 0)
    assert ns["lr"] == 0.1 and ns["model"].weight.abs().sum() > 0
    assert sorted(out["restored"]) == ["lr", "model", "opt"]


def test_a_pickled_only_variable_needs_allow_pickle(tmp_path):
    ns = namespace()
    staged = write_snapshot(str(tmp_path), "snap", ns, ["lr", "custom"])
    model = ns["model"]
    ns["custom"] = Custom(0)
    with pytest.raises(SnapshotError, match=r"^.*/snap/vars\.pt holds objects that only load by unpickling code "
                                            r".*roll back with allow_pickle=True if you trust this storage$"):
        snapshot_io.load(ns, staged.final_url, 0)
    assert ns["custom"] == Custom(0)
    out = snapshot_io.load(ns, staged.final_url, 0, allow_pickle=True)
    assert ns["custom"] == Custom(3) and ns["model"] is model and "custom" in out["restored"]


def _hand_written(tmp_path, replicated, variables=None):
    """A committed snapshot whose files were written by someone else."""
    staged = begin_dir(str(tmp_path), "planted")
    with staged.open(snapshot_io.REPLICATED) as fh:
        torch.save(replicated, fh)
    if variables is not None:
        with staged.open(snapshot_io.VARS) as fh:
            torch.save(variables, fh)
    with staged.open(snapshot_io.rank_file(0)) as fh:
        torch.save({"rng": snapshot.rng_state(), "fingerprint": {}}, fh)
    with staged.open(snapshot_io.META) as fh:
        fh.write(json.dumps({"world_size": 1, "vars": [], "fingerprint": {}}).encode())
    commit_dir(staged)
    return staged


def test_weights_that_need_unpickling_never_load(tmp_path):
    ns = namespace()
    replicated = {"modules": {"model": ns["model"].state_dict()}, "optimizers": {}, "schedulers": {},
                  "scalers": {}, "vars": {"lr": Boom()}}
    staged = _hand_written(tmp_path, replicated, variables={})
    for allow in (False, True):
        with pytest.raises(SnapshotError, match=r"^.*/planted/replicated\.pt holds objects that only load by "
                                                r"unpickling code .*allow_pickle applies only to vars\.pt"):
            snapshot_io.load(ns, staged.final_url, 0, allow_pickle=allow)
    assert RAN == [] and ns["lr"] == 0.1


def test_an_older_snapshot_with_vars_inside_the_weights_loads(tmp_path):
    ns = namespace()
    replicated = {"modules": {"model": ns["model"].state_dict()}, "optimizers": {}, "schedulers": {},
                  "scalers": {}, "vars": {"lr": 0.5}}
    staged = _hand_written(tmp_path, replicated)
    out = snapshot_io.load(ns, staged.final_url, 0)
    assert ns["lr"] == 0.5 and sorted(out["restored"]) == ["lr", "model"]


def test_a_snapshot_without_vars_has_no_vars_file_and_rolls_back(tmp_path):
    ns = namespace()
    staged = write_snapshot(str(tmp_path), "snap", ns, [])
    files = sorted(p.name for p in (tmp_path / "snap").iterdir())
    assert snapshot_io.VARS not in files and snapshot_io.REPLICATED in files
    with torch.no_grad():
        ns["model"].weight.zero_()
    out = snapshot_io.load(ns, staged.final_url, 0)
    assert ns["model"].weight.abs().sum() > 0 and sorted(out["restored"]) == ["model", "opt"]


def test_rng_state_round_trips_in_both_forms():
    """The RNG state holds its scalars as numbers (fewer tensors to load); snapshots written before held 0-d tensors:
    both restore every generator."""
    import random

    np = pytest.importorskip("numpy")

    def draws():
        return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]

    random.gauss(0, 1)  # a cached gauss value in the python state
    saved = snapshot.rng_state()
    assert not isinstance(saved["python"]["gauss"], torch.Tensor) and isinstance(saved["numpy"]["pos"], int)
    expected = draws()
    snapshot.set_rng_state(saved)
    assert draws() == expected
    older = {**saved, "numpy": {k: torch.tensor(v) if not isinstance(v, torch.Tensor) else v
                                for k, v in saved["numpy"].items()},
             "python": {k: torch.tensor(v) if not isinstance(v, torch.Tensor) else v
                        for k, v in saved["python"].items()}}
    snapshot.set_rng_state(older)
    assert draws() == expected
    staged = torch.load(_save_to_bytes(saved), weights_only=True)  # numbers load weights-only
    snapshot.set_rng_state(staged)
    assert draws() == expected


def _save_to_bytes(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_a_rank_given_the_checked_files_does_not_list_the_directory_again(tmp_path, monkeypatch):
    ns = namespace()
    staged = write_snapshot(str(tmp_path), "snap", ns, ["lr"])
    files = snapshot_io.state_files(staged.final_url)  # what the driver checks once

    def listed(url):
        raise AssertionError(f"{url} listed again on a rank")

    monkeypatch.setattr(snapshot_io, "state_files", listed)
    ns["lr"] = 5.0
    out = snapshot_io.load(ns, staged.final_url, 0, files=files)
    assert ns["lr"] == 0.1 and sorted(out["restored"]) == ["lr", "model", "opt"]
    with pytest.raises(AssertionError, match="listed again"):
        snapshot_io.load(ns, staged.final_url, 0)
