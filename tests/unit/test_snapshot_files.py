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
    with staged.open(snapshot_io.older_rank_file(0)) as fh:  # as snapshots written before rank-<r>.json held it
        torch.save({"rng": _older_rng_form(), "fingerprint": {}}, fh)
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


def _older_rng_form(scalars_as_tensors=False):
    """The RNG state as snapshots before ``rank-<r>.json`` kept it in ``rank-<r>.pt``: arrays as tensors, scalars as
    numbers (or, earlier still, as 0-d tensors)."""
    import random

    import numpy as np

    num = torch.tensor if scalars_as_tensors else (lambda v: v)
    _, keys, pos, has_gauss, gauss = np.random.get_state()
    version, internal, pgauss = random.getstate()
    return {"torch": torch.get_rng_state(),
            "numpy": {"keys": torch.from_numpy(keys.astype("int64")), "pos": num(int(pos)),
                      "has_gauss": num(int(has_gauss)), "gauss": num(float(gauss))},
            "python": {"version": num(int(version)), "internal": torch.tensor(internal, dtype=torch.int64),
                       "gauss": num(float("nan") if pgauss is None else float(pgauss))}}


def _draws():
    import random

    import numpy as np

    return torch.rand(3).tolist(), np.random.rand(3).tolist(), [random.random() for _ in range(3)]


def test_rng_state_is_plain_data_and_round_trips_in_every_form():
    """The RNG state is JSON (generator bytes in base64): it survives a JSON round trip and restores every generator;
    the forms older snapshots hold (tensors; scalars as numbers or as 0-d tensors) restore them too."""
    import random

    pytest.importorskip("numpy")
    random.gauss(0, 1)  # a cached gauss value in the python state
    saved = json.loads(json.dumps(snapshot.rng_state()))
    older, oldest = _older_rng_form(), _older_rng_form(scalars_as_tensors=True)
    expected = _draws()
    for state in (saved, older, oldest, torch.load(_save_to_bytes(older), weights_only=True)):
        snapshot.set_rng_state(state)
        assert _draws() == expected


@pytest.mark.parametrize("edit, says", [
    (lambda s: s.pop("torch"), r"KeyError: 'torch'"),
    (lambda s: s.update(torch=s["torch"][:-8]), r"\(torch\) holds \d+ bytes, not the \d+ of a generator here"),
    (lambda s: s["python"].update(internal="not base64!"), r"\(python\) is not base64"),
    (lambda s: s["numpy"].update(keys=7), r"\(numpy\) is a int, not a generator's words"),
])
def test_an_edited_rng_file_is_named_and_nothing_is_loaded(tmp_path, edit, says):
    ns = namespace()
    staged = write_snapshot(str(tmp_path), "snap", ns, [])
    path = tmp_path / "snap" / snapshot_io.rank_file(0)
    files = snapshot_io.state_files(staged.final_url)  # as the driver checked them, before the edit
    own = json.loads(path.read_text())
    edit(own["rng"])
    path.write_text(json.dumps(own))
    with torch.no_grad():
        ns["model"].weight.zero_()
    before = torch.get_rng_state()
    with pytest.raises(SnapshotError, match=r"^.*/snap/rank-0\.json: the RNG state.*" + says):
        snapshot_io.load(ns, staged.final_url, 0, files=files)
    assert ns["model"].weight.abs().sum() == 0 and torch.equal(torch.get_rng_state(), before)


def test_a_snapshot_of_this_form_keeps_each_ranks_state_as_json_and_rolls_the_generators_back(tmp_path):
    ns = namespace()
    staged = write_snapshot(str(tmp_path), "snap", ns, [])
    own = json.loads((tmp_path / "snap" / snapshot_io.rank_file(0)).read_text())
    assert set(own) == {"rng", "fingerprint"} and not (tmp_path / "snap" / snapshot_io.older_rank_file(0)).exists()
    expected = _draws()
    snapshot_io.load(ns, staged.final_url, 0)
    assert _draws() == expected


def _save_to_bytes(obj):
    import io

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


def test_a_rank_given_the_checked_files_and_meta_neither_lists_the_directory_nor_reads_its_meta(tmp_path,
                                                                                                   monkeypatch):
    ns = namespace()
    staged = write_snapshot(str(tmp_path), "snap", ns, ["lr"])
    files = snapshot_io.state_files(staged.final_url)  # what the driver checks once
    meta = snapshot_io.read_meta(staged.final_url)  # and reads once

    def again(what):
        def fail(url):
            raise AssertionError(f"{url}: {what} again on a rank")
        return fail

    monkeypatch.setattr(snapshot_io, "state_files", again("listed"))
    monkeypatch.setattr(snapshot_io, "read_meta", again("meta read"))
    ns["lr"] = 5.0
    out = snapshot_io.load(ns, staged.final_url, 0, files=files, meta=meta)
    assert ns["lr"] == 0.1 and sorted(out["restored"]) == ["lr", "model", "opt"]
    with pytest.raises(AssertionError, match="listed again"):
        snapshot_io.load(ns, staged.final_url, 0)
    with pytest.raises(AssertionError, match="meta read again"):
        snapshot_io.load(ns, staged.final_url, 0, files=files)


def test_a_damaged_meta_file_is_named(tmp_path):
    ns = namespace()
    staged = write_snapshot(str(tmp_path), "snap", ns, [])
    (tmp_path / "snap" / snapshot_io.META).write_text('{"world_size": 1, "va')
    with pytest.raises(SnapshotError, match=r"^.*/snap/snapshot\.json is truncated or damaged \(JSONDecodeError"):
        snapshot_io.read_meta(staged.final_url)
