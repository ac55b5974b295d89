"""Which files of the notebook's folder would be shipped to a remote cluster, their size, and whether to ship.

Ray ships a ``runtime_env={"working_dir": ...}`` by walking the folder and skipping every path that its
``excludes`` or a ``.gitignore``/``.rayignore`` on the way matches (gitignore-style "gitwildmatch"
patterns, ``ray/_private/runtime_env/packaging.py``). :func:`select` walks the same way with the same
pattern semantics (mirrored below from the pathspec copy Ray vendors, without importing Ray), so the size
checked before connecting is the size Ray would upload.
"""
from __future__ import annotations

import dataclasses
import logging
import ipaddress
import os
import re
import socket
from pathlib import Path
from typing import Callable, Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Set, Tuple

from .errors import GroupError

logger = logging.getLogger(__name__)

#: What never leaves this machine: secrets, credentials, virtual environments, caches, checkpoint files.
EXCLUDES: Tuple[str, ...] = (
    ".env*", ".ssh", ".aws", ".git", ".git-credentials", ".netrc", ".pypirc", ".gnupg", ".kube", ".docker",
    ".azure", "*.pem", "*.key",
    ".venv", "venv",
    "auth_token",  # Ray's token file (~/.ray/auth_token)
    "__pycache__", ".ipynb_checkpoints",
    "*.pt", "*.ckpt", "*.tar", "*.zip",
)
#: A folder is a virtual environment when it holds this file (``python -m venv``, virtualenv, uv).
VENV_MARKER = "pyvenv.cfg"
#: The most a remote cluster is sent, after the excludes.
LIMIT_BYTES = 100 * 1000 * 1000

_Matcher = Callable[[Path], bool]


@dataclasses.dataclass(frozen=True)
class Selection:
    """The files that would be shipped (relative POSIX paths), their total size, and the excludes to give Ray."""

    folder: str
    files: Tuple[str, ...]
    size: int
    excludes: Tuple[str, ...]
    largest: Optional[Tuple[str, int]] = None  # the heaviest top-level entry shipped, and its size


def _segment_regex(glob: str) -> str:
    """One path segment of a gitwildmatch pattern as a regex (``*``, ``?``, ``[...]``, backslash escapes)."""
    out, i, end, escape = "", 0, len(glob), False
    while i < end:
        char = glob[i]
        i += 1
        if escape:
            escape = False
            out += re.escape(char)
        elif char == "\\":
            escape = True
        elif char == "*":
            out += "[^/]*"
        elif char == "?":
            out += "[^/]"
        elif char == "[":
            j = i + (1 if i < end and glob[i] == "!" else 0)
            j += 1 if j < end and glob[j] == "]" else 0
            while j < end and glob[j] != "]":
                j += 1
            if j >= end:
                out += "\\["
                continue
            expr = "["
            if glob[i] == "!":
                expr, i = expr + "^", i + 1
            elif glob[i] == "^":
                expr, i = expr + "\\^", i + 1
            out += expr + glob[i:j + 1].replace("\\", "\\\\")
            i = j + 1
        else:
            out += re.escape(char)
    return out


def pattern_regex(pattern: str) -> Tuple[Optional[str], Optional[bool]]:
    """A gitwildmatch pattern as (regex, include): include None for a comment or blank line, False for ``!``."""
    pattern = pattern.strip()
    if not pattern or pattern.startswith("#") or pattern == "/":
        return None, None
    include = not pattern.startswith("!")
    pattern = pattern if include else pattern[1:]
    pattern = pattern[1:] if pattern.startswith("\\") else pattern
    segs = pattern.split("/")
    if not segs[0]:
        del segs[0]  # "/x": anchored at the root
    elif (len(segs) == 1 or (len(segs) == 2 and not segs[1])) and segs[0] != "**":
        segs.insert(0, "**")  # "x" or "x/": at any depth
    if not segs[-1] and len(segs) > 1:
        segs[-1] = "**"  # "x/": everything under x
    out, need_slash, last = ["^"], False, len(segs) - 1
    for i, seg in enumerate(segs):
        if seg == "**":
            if i == 0 and i == last:
                out.append(".+")
            elif i == 0:
                out.append("(?:.+/)?")
                need_slash = False
            elif i == last:
                out.append("/.*")
            else:
                out.append("(?:/.+)?")
                need_slash = True
        else:
            out.append(("/" if need_slash else "") + ("[^/]+" if seg == "*" else _segment_regex(seg)))
            if seg != "*" and i == last and include:
                out.append("(?:/.*)?")  # "x" matches the folder x and everything under it
            need_slash = True
    out.append("$")
    return "".join(out), include


def matcher(patterns: Iterable[str], base: Path) -> _Matcher:
    """Whether a path (relative to ``base``, as Ray writes it) matches: the last matching pattern decides."""
    compiled = [(re.compile(rx), inc) for rx, inc in map(pattern_regex, patterns) if rx is not None]
    base = base.absolute()

    def match(path: Path) -> bool:
        rel = str(path.absolute().relative_to(base)).replace(os.sep, "/")
        rel = rel[2:] if rel.startswith("./") else rel
        hit = False
        for regex, include in compiled:
            if regex.match(rel):
                hit = bool(include)
        return hit

    return match


def _ignore_files(folder: Path, include_gitignore: bool) -> List[_Matcher]:
    """The matchers of the ``.gitignore`` (unless ignored) and ``.rayignore`` in ``folder``, as Ray reads them."""
    found = []
    for name in ((".gitignore", ".rayignore") if include_gitignore else (".rayignore",)):
        if (folder / name).is_file():
            with open(folder / name, encoding="utf-8", errors="replace") as fh:
                found.append(matcher(fh.readlines(), folder))
    return found


def _escape(rel: str) -> str:
    """A relative path as a pattern anchored at the root that matches exactly that path."""
    return "/" + "".join("\\" + c if c in "[]!*#?\\" else c for c in rel)


def select(folder: str, *, include_gitignore: bool = True, secret_files: Sequence[str] = ()) -> Selection:
    """The files Ray would ship from ``folder`` with :data:`EXCLUDES`, virtual environments and ``secret_files``
    (absolute paths, e.g. a token file named by ``RAY_AUTH_TOKEN_PATH``) left out.

    Walks like Ray (symbolic links followed, each directory's ignore files applying below it); a folder holding
    ``pyvenv.cfg`` is left out and added to the returned excludes, anchored, since no pattern can say it.
    """
    root = Path(folder).absolute()
    excludes = list(EXCLUDES)
    for secret in secret_files:
        try:
            excludes.append(_escape(Path(secret).absolute().relative_to(root).as_posix()))
        except ValueError:
            continue  # outside the folder: never shipped anyway
    files: List[str] = []
    sizes: Dict[str, int] = {}
    static = matcher(excludes, root)

    def walk(path: Path, active: List[_Matcher], above: FrozenSet[str]) -> None:
        active = active + (_ignore_files(path, include_gitignore) if path.is_dir() else [])
        if static(path) or any(m(path) for m in active):
            return
        if path.is_dir():
            real = os.path.realpath(path)
            if real in above:
                return  # a link back to a folder above: Ray would recurse until it fails
            if path != root and (path / VENV_MARKER).is_file():
                excludes.append(_escape(path.relative_to(root).as_posix()))
                return
            for child in sorted(path.iterdir()):
                walk(child, active, above | {real})
        elif path.is_file():
            rel = path.relative_to(root).as_posix()
            files.append(rel)
            top = rel.split("/", 1)[0]
            sizes[top] = sizes.get(top, 0) + path.stat().st_size

    walk(root, [], frozenset())
    largest = max(sizes.items(), key=lambda kv: kv[1]) if sizes else None
    return Selection(str(root), tuple(files), sum(sizes.values()), tuple(excludes), largest)


def check_size(selection: Selection, limit: int = LIMIT_BYTES) -> None:
    """Refuse a folder too large to ship.

    Raises:
        GroupError: one line naming the folder's size and how to pass a ``runtime_env`` of one's own.
    """
    if selection.size <= limit:
        return
    biggest = f" (largest: {selection.largest[0]}, {selection.largest[1] / 1e6:.1f} MB)" if selection.largest else ""
    raise GroupError(
        f"the notebook's folder {selection.folder} holds {selection.size / 1e6:.1f} MB to ship after the excludes"
        f"{biggest}, over the {limit / 1e6:.0f} MB limit: list large files in a .rayignore, or set "
        "RAYTRAIN_NB_WORKING_DIR=0 and call ray.init(address=..., runtime_env={'working_dir': ..., "
        "'excludes': [...]}) yourself before starting a group")


def is_local_address(address: str, local_addresses: Iterable[str]) -> bool:
    """Whether a node's address is this machine's: a loopback address or one of ``local_addresses``."""
    address = address.strip().lower().strip("[]")
    try:
        if ipaddress.ip_address(address).is_loopback:
            return True
    except ValueError:
        pass
    return address in {a.strip().lower().strip("[]") for a in local_addresses}


def should_ship(started_here: bool, nodes: Iterable[Mapping], local_addresses: Iterable[str]) -> bool:
    """Whether the folder goes to the cluster: only when some live node runs on another machine.

    Args:
        started_here: the embedded instance this process started (its workers run here: never shipped).
        nodes: ``ray.nodes()`` records (``Alive``, ``NodeManagerAddress``).
        local_addresses: this machine's own addresses (interfaces, hostname, the address Ray uses here).
    """
    if started_here:
        return False
    local = list(local_addresses)
    return any(not is_local_address(str(n.get("NodeManagerAddress", "")), local)
               for n in nodes if n.get("Alive", True))


def this_machine_addresses() -> Set[str]:
    """This machine's own addresses: every interface's, its hostname's, and the one Ray uses here."""
    found = {"localhost", socket.gethostname()}
    try:
        found |= {str(info[4][0]) for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        pass
    try:
        import psutil  # bundled with Ray (ray/thirdparty_files): every interface's addresses

        found |= {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs
                  if a.family in (socket.AF_INET, socket.AF_INET6)}
    except ImportError:
        logger.debug("psutil is missing: this machine's addresses come from its hostname only")
    try:
        from ray.util import get_node_ip_address  # ray: loaded when a group or trainer runs

        found.add(get_node_ip_address())
    except Exception:  # noqa: BLE001 - no route out: the other sources still stand
        pass
    return found
