"""The checkpoint ledger: what each snapshot and reported checkpoint must hold, and the check that every
committed one still loads and holds it.

Expectations come from two places: the driver's digests of rank 0 just before a snapshot between
cells, and the notes rank 0 appends to a ledger file (``soak_note``) just before every ``report()``
(a reported checkpoint holds that state; a snapshot asked for while a cell runs is taken at a report).
The run's index is read from storage afresh each time (``CheckpointManager.load``), so a checkpoint
that vanished from storage or from the index is caught.
"""
from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Optional, Set, Tuple

from . import digest


def saved_digests(replicated: Dict[str, Any]) -> Set[str]:
    """Digests of every state dict in a snapshot's ``replicated.pt``."""
    out = set()
    for kind in ("modules", "optimizers", "schedulers", "scalers"):
        for state in (replicated.get(kind) or {}).values():
            out.add(digest.soak_digest(state))
    return out


def sharded_digests(local: str) -> Set[str]:
    """Digests of every sharded model and optimizer in a snapshot's ``sharded/`` DCP folder, gathered here in one
    process (``dcp_to_torch_save``): their full state, digested as :func:`digest.soak_digests` digests the live
    one (the same canonical state dicts); empty without that folder."""
    import tempfile

    folder = os.path.join(local, "sharded")
    if not os.path.isdir(folder):
        return set()
    from raytrain_nb.torch import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="soak-dcp-") as tmp:
        full = dcp_to_torch_save(folder, os.path.join(tmp, "full.pt"))
    out = set()
    for entry in full.values():
        out.add(digest.soak_digest(entry["model"]))
        out.update(digest.soak_digest(osd) for osd in entry.get("optim", {}).values())
    return out


def top_level(digests: Dict[str, str]) -> Set[str]:
    """Digests of the objects bound to a name (what a snapshot must save), not those inside containers."""
    return {d for path, d in digests.items() if "[" not in path and "." not in path}


def matches(saved: Set[str], expected: Dict[str, str]) -> bool:
    """A snapshot holding ``saved`` is the state ``expected`` (path -> digest): everything it saved is part
    of that state, and every object bound to a name was saved."""
    return saved <= set(expected.values()) and top_level(expected) <= saved


class Ledger:
    """Expectations and verification for one run directory.

    Args:
        run_dir: the run directory (local).
        notes_path: the file rank 0 appends its notes to.
    """

    def __init__(self, run_dir: str, notes_path: str) -> None:
        self.run_dir = run_dir
        self.notes_path = notes_path
        self.expected: Dict[str, List[Dict[str, str]]] = {}  # snapshot name -> acceptable states
        self.expected_tags: Dict[str, str] = {}  # snapshot name -> tag of the cell it was taken in
        self.committed: Dict[str, str] = {}  # name -> kind, every committed checkpoint seen
        self.verified: Set[str] = set()
        self.snapshot_digests: Dict[str, Set[str]] = {}  # snapshot name -> what it holds
        self.tags: Dict[str, str] = {}  # reported checkpoint -> tag of the cell that wrote it

    # -- expectations ----------------------------------------------------------------------------

    def expect_snapshot(self, name: str, state: Optional[Dict[str, str]]) -> None:
        """Snapshot ``name`` (between cells) must hold ``state`` (rank 0's digests at the call; None: unknown,
        the snapshot is only checked to load)."""
        if state is not None:
            self.expected.setdefault(name, []).append(dict(state))

    def expect_snapshot_in_cell(self, name: str, tag: str) -> None:
        """Snapshot ``name``, asked for while cell ``tag`` ran, must hold the state of one of its reports."""
        self.expected_tags[name] = tag

    def notes(self) -> List[Dict[str, Any]]:
        if not os.path.exists(self.notes_path):
            return []
        out = []
        with open(self.notes_path) as fh:
            for line in fh:
                try:
                    out.append(json.loads(line))
                except ValueError:
                    continue  # a note torn by a kill mid-write
        return out

    # -- verification ----------------------------------------------------------------------------

    def entries(self) -> List[Any]:
        """The run's committed checkpoints, from the index in storage."""
        from raytrain_nb import CheckpointError, CheckpointManager

        if not os.path.exists(os.path.join(self.run_dir, "checkpoints.json")):
            return []
        try:
            return CheckpointManager.load(self.run_dir).list()
        except CheckpointError:
            if not self.committed:
                return []
            raise

    def check(self, reverify: bool = False) -> List[str]:
        """Verify every committed checkpoint not verified yet (all of them with ``reverify``).

        Returns:
            Violations, one line each: a committed checkpoint lost, unloadable or holding other state.
        """
        problems: List[str] = []
        try:
            entries = self.entries()
        except Exception as exc:  # noqa: BLE001 - an unreadable index loses every checkpoint
            return [f"the checkpoint index of {self.run_dir} cannot be read: {type(exc).__name__}: {exc}"]
        listed = {e.name: e for e in entries}
        for name, kind in sorted(self.committed.items()):
            if name not in listed:
                problems.append(f"committed {kind} checkpoint {name} is no longer in the run's index (lost)")
        notes = None
        for name, entry in listed.items():
            self.committed.setdefault(name, entry.kind)
            if name in self.verified and not reverify:
                continue
            if notes is None:
                notes = self.notes()
            problem = self._verify(entry, notes)
            if problem:
                problems.append(f"{entry.kind} checkpoint {name}: {problem}")
            else:
                self.verified.add(name)
        return problems

    def _verify(self, entry: Any, notes: List[Dict[str, Any]]) -> Optional[str]:
        import torch

        try:
            local = entry.checkpoint.to_directory()
        except Exception as exc:  # noqa: BLE001
            return f"does not load: {type(exc).__name__}: {str(exc)[:300]}"
        try:
            if entry.kind == "snapshot":
                replicated = torch.load(os.path.join(local, "replicated.pt"), weights_only=True, map_location="cpu")
                saved = saved_digests(replicated) | sharded_digests(local)
                self.snapshot_digests[entry.name] = saved
                return self._check_snapshot(entry.name, saved, notes)
            return self._check_reported(entry.name, local, notes)
        except Exception as exc:  # noqa: BLE001
            return f"its files do not load: {type(exc).__name__}: {str(exc)[:300]}"
        finally:
            shutil.rmtree(local, ignore_errors=True)

    def _check_snapshot(self, name: str, saved: Set[str], notes: List[Dict[str, Any]]) -> Optional[str]:
        options = list(self.expected.get(name, []))
        tag = self.expected_tags.get(name)
        if tag is not None:
            options += [n["digests"] for n in notes if n.get("tag") == tag]
        if not options:
            return None if name not in self.expected and tag is None else "no state to compare with"
        if any(matches(saved, o) for o in options):
            return None
        return (f"holds other state than was saved ({len(saved)} objects; none of {len(options)} expected "
                "states matches)")

    def _check_reported(self, name: str, local: str, notes: List[Dict[str, Any]]) -> Optional[str]:
        import torch

        meta_path = os.path.join(local, "soak.json")
        if not os.path.exists(meta_path):
            return "soak.json is missing (rank 0's files are not all there)"
        with open(meta_path) as fh:
            meta = json.load(fh)
        self.tags[name] = meta["tag"]
        state = torch.load(os.path.join(local, "state.pt"), weights_only=True, map_location="cpu")
        now = {path: digest.soak_digest(sd) for path, sd in state.items()}
        saved = {p: d for p, d in meta["digests"].items() if p not in digest.SOAK_NOT_REPORTED}
        if now != saved:
            bad = sorted(p for p in set(now) | set(saved) if now.get(p) != saved.get(p))
            return f"state.pt differs from what rank 0 saved ({', '.join(bad[:4])})"
        noted = [n for n in notes if n.get("tag") == meta["tag"] and n.get("step") == meta["step"]
                 and n.get("kind") == "ckpt"]
        if noted and not any(n["digests"] == meta["digests"] for n in noted):
            return f"holds other state than rank 0 noted at step {meta['step']}"
        return None

    def reported_of(self, tag: str) -> List[str]:
        """Names of the committed reported checkpoints written by cell ``tag`` (verifying new ones first)."""
        self.check()
        return sorted(n for n, t in self.tags.items() if t == tag and n in self.committed)

    def rollback_problem(self, name: str, per_rank: List[Dict[str, str]]) -> Optional[str]:
        """After rolling back to ``name``: every object it saved must be back on every rank."""
        saved = self.snapshot_digests.get(name)
        if saved is None:
            return None
        for rank, digests in enumerate(per_rank):
            missing = saved - set(digests.values())
            if missing:
                return f"after rollback to {name}, rank {rank} does not hold {len(missing)} of its {len(saved)} objects"
        return None


def compare_ranks(per_rank: List[Dict[str, str]]) -> Tuple[List[str], List[str]]:
    """Paths whose state differs across ranks, and paths present on some ranks only."""
    if not per_rank:
        return [], []
    common = set(per_rank[0]).intersection(*per_rank[1:])
    every = set(per_rank[0]).union(*per_rank[1:])
    differ = sorted(p for p in common if len({d[p] for d in per_rank}) > 1)
    return differ, sorted(every - common)
