"""Every public name of the installed Ray Train exists at the same place here, with the same signature.

``ray_surface.py`` describes both sides in a process of its own (over stand-ins for TensorFlow, Lightning, Transformers,
XGBoost and LightGBM, so it takes seconds); this module compares them. For every name of Ray Train's public modules
(``ray.train``, ``.torch``, ``.collective``, ``.xgboost``, ``.lightgbm``, ``.lightning``, ``.huggingface.transformers``,
``.tensorflow``, ``.tensorflow.keras``) ours must exist at the same place, be the same kind of thing (a class, an enum
with the same members, an exception, a function, an equal constant), take the same parameters (names, order, kinds and
defaults; annotations are not compared) and, for a class, have every member Ray's own classes define, methods with the
same parameters. Ray's ``'DEPRECATED'`` defaults mark arguments Ray Train refuses: ours may accept or refuse them, so
their defaults are not compared. Our extra parameters come after Ray's, have defaults, and are listed in the README's
table of extensions. A new Ray release shows what it added as failures here.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, List, Optional

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(HERE))
import ray_surface  # noqa: E402 - the describer lives beside this test; it runs in a process of its own

#: Constructors not compared: Ray's is abstract or internal, users get the object from the library.
NOT_BUILT_BY_USERS = {("ray.train", "TrainContext")}

#: Ray's default of an argument that Ray Train V2 refuses.
DEPRECATED = repr(ray_surface.DEPRECATED)

DATA_KINDS = {"property", "attribute", "member"}


def _run(args: List[str]) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(HERE / "ray_surface.py"), *args], capture_output=True, text=True,
                          cwd=str(ROOT), env=env, timeout=300)
    assert proc.returncode == 0, f"ray_surface.py {' '.join(args)} failed:\n{proc.stderr[-3000:]}"
    return json.loads(proc.stdout)


@pytest.fixture(scope="module")
def surface() -> Dict[str, Any]:
    """Both sides, described over the stand-ins; a module that does not import over them is described again with the
    real libraries."""
    pytest.importorskip("ray.train")
    described = _run(["--stub"])
    again = [name for name, pair in described["pairs"].items() if name in dict(ray_surface.PAIRS)
             and (_import_error(pair["ray"]) or _stub_trouble(pair["our"]))]
    if again:
        described["pairs"].update(_run(again)["pairs"])
    return described


def _import_error(side: Dict[str, Any]) -> Optional[str]:
    return side.get("error")


def _stub_trouble(side: Dict[str, Any]) -> bool:
    """An import error on our side that is not simply our module missing."""
    error = side.get("error")
    return bool(error) and "No module named 'raytrain_nb" not in error


def _sig_says_nothing(sig: Optional[List[List[Any]]]) -> bool:
    return sig is None or [p[1] for p in sig] in (["VAR_POSITIONAL", "VAR_KEYWORD"], ["self", "VAR_POSITIONAL",
                                                                                        "VAR_KEYWORD"])


def compare_signatures(where: str, ray: Optional[List[List[Any]]], ours: Optional[List[List[Any]]],
                       extensions: List[str]) -> List[str]:
    """What differs between Ray's parameters and ours; our extra parameters go to ``extensions``."""
    if _sig_says_nothing(ray):
        return []
    if ours is None:
        return [f"{where}: Python cannot read our signature"]
    ray, ours = _public(ray), _public(ours)
    ray_names = [p[0] for p in ray]
    problems = []
    kept = [p for p in ours if p[0] in ray_names]
    if [p[0] for p in kept] != ray_names:
        missing = [n for n in ray_names if n not in {p[0] for p in ours}]
        if missing:
            problems.append(f"{where}: missing parameter(s) {', '.join(missing)} "
                            f"(Ray: {_fmt(ray)}; ours: {_fmt(ours)})")
        else:
            problems.append(f"{where}: parameters in another order (Ray: {_fmt(ray)}; ours: {_fmt(ours)})")
        return problems
    for mine, theirs in zip(kept, ray):
        name, kind, has_default, default = theirs
        if mine[1] != kind:
            problems.append(f"{where}: parameter {name} is {mine[1]}, Ray's is {kind}")
        if default == DEPRECATED:
            continue
        if mine[2] != has_default or mine[3] != default:
            problems.append(f"{where}: parameter {name} defaults to {mine[3] if mine[2] else 'nothing'}, "
                            f"Ray's to {default if has_default else 'nothing'}")
    last_positional = max((i for i, p in enumerate(ours) if p[0] in ray_names and p[1] in
                           ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")), default=-1)
    for i, (name, kind, has_default, _default) in enumerate(ours):
        if name in ray_names or kind in ("VAR_POSITIONAL", "VAR_KEYWORD"):
            continue
        if not has_default:
            problems.append(f"{where}: our extra parameter {name} has no default (a call written for Ray fails)")
        elif kind != "KEYWORD_ONLY" and i < last_positional:
            problems.append(f"{where}: our extra parameter {name} comes before Ray's positional ones")
        else:
            extensions.append(f"{where}({name}=)")
    return problems


def _public(sig: List[List[Any]]) -> List[List[Any]]:
    """The parameters a caller may pass (``_storage_filesystem`` and the like are private on both sides)."""
    return [p for p in sig if not p[0].startswith("_")]


def _fmt(sig: List[List[Any]]) -> str:
    marks = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}
    return "(" + ", ".join(marks.get(p[1], "") + p[0] + (f"={p[3]}" if p[2] else "") for p in sig) + ")"


def compare_entry(where: str, ray: Dict[str, Any], ours: Dict[str, Any], extensions: List[str]) -> List[str]:
    """What differs between one of Ray's public names and ours."""
    if ours["kind"] == "missing":
        return [f"{where}: missing"]
    if ours["kind"] == "error":
        return [f"{where}: fails to load: {ours['error']}"]
    kind = ray["kind"]
    if kind in ("class", "enum"):
        if ours["kind"] not in ("class", "enum"):
            return [f"{where}: Ray's is a class, ours a {ours['kind']}"]
        if kind == "enum" and (ours["kind"] != "enum" or ours["values"] != ray["values"]):
            return [f"{where}: Ray's enum has {ray['values']}, ours {ours.get('values')}"]
        if ray["exception"] and not ours["exception"]:
            return [f"{where}: Ray's is an exception, ours is not"]
        return compare_class(where, ray, ours, extensions)
    if kind == "function":
        if ours["kind"] not in ("function", "class"):
            return [f"{where}: Ray's is a function, ours a {ours['kind']}"]
        return compare_signatures(where, ray["signature"], ours["signature"], extensions)
    if kind == "value" and ours.get("value") != ray["value"]:
        return [f"{where}: Ray's is {ray['value']}, ours {ours.get('value', ours['kind'])}"]
    return []


def compare_class(where: str, ray: Dict[str, Any], ours: Dict[str, Any], extensions: List[str]) -> List[str]:
    module, _, name = where.rpartition(".")
    problems = []
    if (module, name) not in NOT_BUILT_BY_USERS and ray["kind"] != "enum":
        problems += compare_signatures(where, ray["signature"], ours["signature"], extensions)
    for member, theirs in sorted(ray["members"].items()):
        at = f"{where}.{member}"
        mine = ours["members"].get(member)
        if mine is None and ours.get("library_base"):
            continue  # ours inherits from a library replaced by a stand-in here: its members are the library's
        if mine is None:
            problems.append(f"{at}: missing")
        elif theirs["kind"] in DATA_KINDS:
            if mine["kind"] not in DATA_KINDS:
                problems.append(f"{at}: Ray's is a {theirs['kind']}, ours a {mine['kind']}")
        elif mine["kind"] != theirs["kind"]:
            problems.append(f"{at}: Ray's is a {theirs['kind']}, ours a {mine['kind']}")
        else:
            problems += compare_signatures(at, theirs.get("signature"), mine.get("signature"), extensions)
    return problems


def _pair_problems(surface: Dict[str, Any], ray_module: str, extensions: List[str]) -> List[str]:
    pair = surface["pairs"][ray_module]
    if _import_error(pair["ray"]):
        pytest.skip(f"{ray_module} does not import here: {pair['ray']['error']}")
    if _import_error(pair["our"]):
        return [f"{pair['ours']}: does not import: {pair['our']['error']}"]
    problems = []
    for name, ray in pair["ray"]["names"].items():
        place = ray_module if ray_module in EXTRA_NAMES else f"{ray_module}.{name}"
        problems += compare_entry(place, ray, pair["our"]["names"][name], extensions)
    return problems


EXTRA_NAMES = [f"{m}.{n}" for m, n, _o in ray_surface.EXTRA]
ALL_PAIRS = [ray for ray, _ours in ray_surface.PAIRS] + EXTRA_NAMES


@pytest.mark.parametrize("ray_module", ALL_PAIRS)
def test_same_names_and_signatures_as_ray_train(surface, ray_module):
    problems = _pair_problems(surface, ray_module, [])
    assert not problems, (f"{len(problems)} difference(s) from Ray Train {surface['ray_version']}:\n  "
                          + "\n  ".join(problems))


def test_every_extra_parameter_is_in_the_readme_table_of_extensions(surface):
    extensions: List[str] = []
    for ray_module in ALL_PAIRS:
        try:
            _pair_problems(surface, ray_module, extensions)
        except pytest.skip.Exception:
            continue
    table = readme_extensions()
    unlisted = [e for e in extensions if not _listed(e, table)]
    assert not unlisted, ("extra parameters missing from the README's table of extensions (a script that uses them "
                          "fails on Ray Train):\n  " + "\n  ".join(unlisted))


def readme_extensions() -> str:
    text = (ROOT / "README.md").read_text()
    start, end = text.find("<!-- extensions"), text.find("<!-- end of extensions -->")
    assert 0 <= start < end, "README.md has no table of extensions (<!-- extensions --> ... <!-- end of extensions -->)"
    return text[start:end]


def _listed(extension: str, table: str) -> bool:
    """``ray.train.torch.TorchTrainer(metadata=)`` is listed where a row names ``TorchTrainer(...metadata=``."""
    owner, param = re.fullmatch(r"(.*)\((\w+)=\)", extension).groups()
    short = owner.rsplit(".", 2)
    short_name = ".".join(short[-2:]) if short[-1][:1].islower() and short[-2][:1].isupper() else short[-1]
    pattern = re.escape(short_name) + r"\([^)`]*\b" + re.escape(param) + "="
    return re.search(pattern, table) is not None


# -- the comparison itself -----------------------------------------------------------------------------------------

def _p(name, kind="POSITIONAL_OR_KEYWORD", default=None):
    return [name, kind, default is not None, default]


def test_the_comparison_finds_each_kind_of_difference():
    ray = [_p("model"), _p("move_to_device", default="True"), _p("mode", default=DEPRECATED)]
    ext: List[str] = []
    assert compare_signatures("f", ray, [_p("model"), _p("move_to_device", default="True"),
                                         _p("mode", default="None"), _p("total", "KEYWORD_ONLY", "None")], ext) == []
    assert ext == ["f(total=)"]
    assert "missing parameter(s) mode" in compare_signatures("f", ray, ray[:2], [])[0]
    assert "another order" in compare_signatures("f", ray, [ray[1], ray[0], ray[2]], [])[0]
    other_default = [ray[0], _p("move_to_device", default="False"), ray[2]]
    assert "defaults to False, Ray's to True" in compare_signatures("f", ray, other_default, [])[0]
    assert "is KEYWORD_ONLY" in compare_signatures("f", ray, [_p("model", "KEYWORD_ONLY"), *ray[1:]], [])[0]
    assert "before Ray's positional" in compare_signatures("f", ray, [ray[0], _p("x", default="1"), *ray[1:]], [])[0]
    assert "has no default" in compare_signatures("f", ray, [*ray, _p("x", "KEYWORD_ONLY")], [])[0]
    assert compare_signatures("f", [_p("args", "VAR_POSITIONAL"), _p("kwargs", "VAR_KEYWORD")], [_p("x")], []) == []
    cls = {"kind": "class", "exception": False, "signature": [], "members": {"get": {"kind": "method", "signature":
           [_p("self")]}, "size": {"kind": "property"}}}
    assert compare_entry("m.C", cls, {**cls, "members": {"size": {"kind": "attribute"}}}, []) == ["m.C.get: missing"]
    assert compare_entry("m.C", cls, {"kind": "function", "signature": []}, []) == ["m.C: Ray's is a class, ours a "
                                                                                    "function"]
    assert compare_entry("m.K", {"kind": "value", "value": "'train'"}, {"kind": "value", "value": "'x'"}, [])


def test_the_readme_match_of_an_extension():
    table = ("| `TorchTrainer(..., metadata=...)` | x |\n| `report(metrics, total=N)` | y |\n"
             "| `TrainContext.get_metadata()`")
    assert _listed("ray.train.torch.TorchTrainer(metadata=)", table)
    assert _listed("ray.train.report(total=)", table)
    assert not _listed("ray.train.torch.TorchTrainer(backend=)", table)
