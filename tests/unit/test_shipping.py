"""What of the notebook's folder goes to a cluster: secrets and environments never, large folders refused, and
only to clusters with nodes on other machines."""
from __future__ import annotations

import os
import zipfile
from pathlib import Path

import pytest

from raytrain_nb._internal import shipping
from raytrain_nb._internal.errors import GroupError

NORMAL = ["train.py", "pkg/__init__.py", "pkg/model.py", "data/small.csv", "README.md", "env/reward.py",
          "configs/key_schedule.yaml", "environment.yml"]
EXCLUDED = [".env", ".env.local", "sub/.env.production", ".ssh/id_rsa", ".aws/credentials", ".git/config",
            "key.pem", "certs/server.key", ".venv/pyvenv.cfg", ".venv/lib/site.py", "venv/bin/python",
            "myenv/pyvenv.cfg", "myenv/lib/python3.11/site-packages/x.py", "sub/other-env/pyvenv.cfg",
            "sub/other-env/bin/activate", "auth_token", ".ray/auth_token", "__pycache__/train.cpython-311.pyc",
            ".ipynb_checkpoints/nb-checkpoint.ipynb", "model.pt", "runs/last.ckpt", "backup.tar", "data.zip",
            ".netrc", ".git-credentials", "my_token.txt"]


def _tree(root: Path, files) -> None:
    for rel in files:
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(f"content of {rel}\n")


def _sparse(path: Path, size: int) -> None:
    """A file of ``size`` bytes that uses no disk (truncate(2) leaves a hole)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb"):
        pass
    os.truncate(path, size)


def test_only_the_normal_files_are_shipped(tmp_path):
    _tree(tmp_path, NORMAL + EXCLUDED)
    sel = shipping.select(str(tmp_path), secret_files=[str(tmp_path / "my_token.txt"), "/elsewhere/token"])
    assert sorted(sel.files) == sorted(NORMAL)
    assert sel.size == sum((tmp_path / f).stat().st_size for f in NORMAL)
    # a folder is a virtual environment by its pyvenv.cfg, whatever its name: Ray is told, anchored
    assert {"/myenv", "/sub/other-env", "/my_token.txt"} <= set(sel.excludes)
    assert set(shipping.EXCLUDES) <= set(sel.excludes)


def test_ray_ships_exactly_the_selection(tmp_path):
    """Ray's own packer, given the returned excludes, writes exactly the selected files (same walk, same patterns)."""
    packaging = pytest.importorskip("ray._private.runtime_env.packaging")
    _tree(tmp_path / "w", NORMAL + EXCLUDED + ["notes/draft.md", "notes/keep.md", "logs/a.log", "deep/x/.rayignore"])
    (tmp_path / "w/.gitignore").write_text("*.log\nnotes/*\n!notes/keep.md\n")
    (tmp_path / "w/deep/x/.rayignore").write_text("# comment\n\n*.rayignore\n")
    for include_gitignore in (True, False):
        sel = shipping.select(str(tmp_path / "w"), include_gitignore=include_gitignore,
                              secret_files=[str(tmp_path / "w/my_token.txt")])
        out = tmp_path / f"pkg-{include_gitignore}.zip"
        packaging._zip_files(str(tmp_path / "w"), list(sel.excludes), str(out), include_gitignore=include_gitignore)
        with zipfile.ZipFile(out) as zf:
            shipped = sorted(n for n in zf.namelist() if not n.endswith("/"))
        assert sorted(sel.files) == shipped
        assert ("logs/a.log" in sel.files) is not include_gitignore
        assert ("notes/draft.md" in sel.files) is not include_gitignore and "notes/keep.md" in sel.files


@pytest.mark.parametrize("pattern", [
    ".env*", ".ssh", "*.pem", "/myenv", "/sub/other\\-env", "notes/", "notes/*", "!notes/keep.md", "a/**/b",
    "**/x", "x/**", "**", "*", "/", "# c", "", "  ", "\\#hash", "\\!bang", "f?o", "[abc]x", "[!a]x", "[^a]x",
    "[]x]y", "[x", "a\\*b", "dir/sub/", "/dir/", "a/*/c", "*.tar",
])
def test_patterns_compile_as_in_rays_pathspec(pattern):
    gitwildmatch = pytest.importorskip("ray._private.thirdparty.pathspec.patterns.gitwildmatch")
    assert shipping.pattern_regex(pattern) == gitwildmatch.GitWildMatchPattern.pattern_to_regex(pattern)


def test_a_folder_over_the_limit_is_refused_with_its_size(tmp_path):
    _tree(tmp_path, NORMAL)
    _sparse(tmp_path / "data" / "big.bin", 150_000_000)
    _sparse(tmp_path / "checkpoints" / "huge.pt", 900_000_000)  # left out: does not count
    sel = shipping.select(str(tmp_path))
    assert "checkpoints/huge.pt" not in sel.files and sel.largest[0] == "data"
    with pytest.raises(GroupError) as info:
        shipping.check_size(sel)
    msg = str(info.value)
    assert "\n" not in msg and str(tmp_path) in msg and "150.0 MB" in msg and "100 MB" in msg
    assert "RAYTRAIN_NB_WORKING_DIR=0" in msg and "runtime_env=" in msg


def test_a_folder_under_the_limit_passes(tmp_path):
    _sparse(tmp_path / "data.bin", 99_000_000)
    _sparse(tmp_path / "model.ckpt", 500_000_000)
    sel = shipping.select(str(tmp_path))
    assert sel.files == ("data.bin",) and sel.size == 99_000_000
    shipping.check_size(sel)


def test_a_link_back_up_does_not_loop(tmp_path):
    _tree(tmp_path, ["a/b.py"])
    (tmp_path / "a" / "up").symlink_to(tmp_path, target_is_directory=True)
    assert shipping.select(str(tmp_path)).files == ("a/b.py",)


HERE = {"192.168.1.20", "fe80::1", "notebook-host"}


def _node(address: str, alive: bool = True) -> dict:
    return {"NodeManagerAddress": address, "Alive": alive, "NodeManagerHostname": "h"}


@pytest.mark.parametrize("started_here, nodes, ship", [
    (True, [_node("127.0.0.1")], False),                                  # the embedded instance
    (True, [_node("10.0.0.7")], False),                                   # ... whatever it reports
    (False, [_node("127.0.0.1")], False),                                 # `ray start --head` here, 127.0.0.1:6379
    (False, [_node("192.168.1.20"), _node("192.168.1.20")], False),      # this host's IP, several raylets
    (False, [_node("127.0.1.1"), _node("::1"), _node("[fe80::1]")], False),
    (False, [_node("192.168.1.20"), _node("192.168.1.21")], True),       # one node on another machine
    (False, [_node("10.0.0.7")], True),                                   # a remote cluster (even via a tunnel)
    (False, [_node("192.168.1.20"), _node("10.0.0.7", alive=False)], False),  # a dead remote node: not used
    (False, [], False),
])
def test_the_folder_goes_only_to_other_machines(started_here, nodes, ship):
    assert shipping.should_ship(started_here, nodes, HERE) is ship
