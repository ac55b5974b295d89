"""The checkpoints of one run: an index in the run directory, ranked and pruned as in Ray Train.

Two kinds of checkpoints live in a run directory:
- ``"snapshot"``: made interactively (``%dist_checkpoint``); never pruned, deleted only by
  :meth:`CheckpointManager.delete`;
- ``"reported"``: from ``report(metrics, checkpoint=...)``; ranked by ``score_attribute`` and pruned beyond
  ``num_to_keep`` (the latest is never deleted; entries without the score rank lowest).

The index ``checkpoints.json`` is rewritten atomically after every change, so a new kernel can list a run's
checkpoints with :meth:`CheckpointManager.load` without starting a group (metrics also go to ``metrics.jsonl``).

Example: ``mgr = CheckpointManager("s3://b/runs/r1", num_to_keep=2, score_attribute="acc")``; ``staged =
mgr.begin("reported")`` (workers write into ``staged.url``); ``mgr.commit(staged, "reported", {"acc": 0.9})``.
"""
from __future__ import annotations

import logging
import math
import os
import threading
import time
from typing import Any, Dict, List, Optional, Tuple, Union

from fsspec import AbstractFileSystem

from ..errors import CheckpointError, describe
from .checkpoint import Checkpoint
from .index import (FORMAT, INDEX_FILE, STEP_KEYS, CheckpointEntry, check_config, check_kind, entry_label,
                    entry_problem, entry_report, list_runs, score_of)
from .staging import COMMIT_MARKER, StagedDir, begin_dir, commit_dir, delete_dir, discard_dir, read_manifest
from .storage import is_dir_name, is_local, join, read_json, resolve, to_json, to_url, write_bytes_atomic

logger = logging.getLogger(__name__)


class CheckpointManager:
    """The checkpoint index of one run directory.

    Args:
        run_dir_url: the run directory (local path or fsspec URL); an index already there is
            loaded, so a restarted group continues the run.
        num_to_keep: how many reported checkpoints to keep; None keeps all.
        score_attribute: the metric that ranks reported checkpoints; None ranks by recency.
        score_order: ``"max"`` (higher is better) or ``"min"``.
        filesystem: an fsspec filesystem for ``run_dir_url``.

    Raises:
        CheckpointError: a bad argument (naming the field and value) or a damaged index.
    """

    def __init__(self, run_dir_url: Any, num_to_keep: Optional[int] = None,
                 score_attribute: Optional[str] = None, score_order: str = "max", *,
                 filesystem: Optional[Any] = None):
        check_config(num_to_keep, score_attribute, score_order)
        self.num_to_keep = num_to_keep
        self.score_attribute = score_attribute
        self.score_order = score_order
        self._fs, self._run = resolve(run_dir_url, filesystem)
        self._entries: List[CheckpointEntry] = []
        self._next_id = 1
        self._lock = threading.RLock()  # a background snapshot may register while a cell runs
        index = self._read_index()
        if index is not None:
            self._entries, self._next_id = index["entries"], index["next_id"]

    @classmethod
    def load(cls, run_dir_url: Any, *, filesystem: Optional[Any] = None) -> "CheckpointManager":
        """The manager of an existing run, with the settings stored in its index.

        Raises:
            CheckpointError: the run has no index (naming the runs next to it) or it is damaged.
        """
        fs, run = resolve(run_dir_url, filesystem)
        data = read_json(fs, join(run, INDEX_FILE), "checkpoint index", error=CheckpointError,
                         missing_ok=True)
        if data is None:
            runs = list_runs(fs._parent(run), filesystem=fs)
            near = f"; runs next to it: {', '.join(runs)}" if runs else ""
            raise CheckpointError(f"no checkpoint index {to_url(fs, join(run, INDEX_FILE))}: the run has no "
                                  f"checkpoints yet or is not a run directory{near}")
        config = data.get("config") if isinstance(data, dict) else None
        config = config if isinstance(config, dict) else {}
        settings = (config.get("num_to_keep"), config.get("score_attribute"), config.get("score_order", "max"))
        try:
            check_config(*settings)
        except CheckpointError as exc:
            raise CheckpointError(f"checkpoint index {to_url(fs, join(run, INDEX_FILE))}: {exc} (edited by "
                                  "hand?): restore it") from exc
        return cls(run, *settings, filesystem=fs)

    @property
    def run_dir(self) -> str:
        """The run directory's URL (a plain path when local)."""
        return to_url(self._fs, self._run)

    # ------------------------------------------------------------ the index

    def _index_url(self) -> str:
        return to_url(self._fs, join(self._run, INDEX_FILE))

    def _read_index(self) -> Optional[Dict[str, Any]]:
        data = read_json(self._fs, join(self._run, INDEX_FILE), "checkpoint index", error=CheckpointError,
                         missing_ok=True, fix="restore it, or delete it (the checkpoints stay loadable "
                                              "with Checkpoint(path))")
        if data is None:
            return None
        where = f"checkpoint index {self._index_url()}"
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise CheckpointError(f"{where} is not a format-{FORMAT} index (edited by hand?): restore it")
        raw, next_id = data.get("checkpoints"), data.get("next_id")
        if not isinstance(raw, list) or isinstance(next_id, bool) or not isinstance(next_id, int):
            raise CheckpointError(f"{where} has no checkpoint list (edited by hand?): restore it")
        entries: List[CheckpointEntry] = []
        for i, item in enumerate(raw):
            entry = self._entry_from(i, item, where, entries)
            if entry is not None:
                entries.append(entry)
        return {"entries": entries, "next_id": next_id}

    def _entry_from(self, i: int, raw: Any, where: str, earlier: List[CheckpointEntry]) -> Optional[CheckpointEntry]:
        """The entry ``raw`` read from storage, or None (with a warning) when it cannot be trusted."""
        problem = entry_problem(raw)
        url = to_url(self._fs, join(self._run, raw["path"])) if problem is None else ""
        if problem is None and any(e.name == raw["name"] or e.path == url for e in earlier):
            problem = "repeats the name or directory of an earlier entry"
        if problem is not None:
            logger.warning("%s: entry %s %s (edited by hand?): skipped, and dropped from the index on its next "
                           "write; no file is deleted", where, entry_label(i, raw), problem)
            return None
        return CheckpointEntry(name=raw["name"], kind=raw["kind"], path=url, metrics=raw["metrics"],
                               step=raw["step"], time=float(raw["time"]), size_bytes=raw["size_bytes"],
                               report=raw.get("report"), validation=raw.get("validation"), filesystem=self._fs)

    def _locate(self, path: Any) -> Tuple[AbstractFileSystem, str, str]:
        """``(fs, path, url)`` of a checkpoint: on the run's filesystem unless the URL names another."""
        text = os.fspath(path)
        protocols = self._fs.protocol if isinstance(self._fs.protocol, (tuple, list)) else (self._fs.protocol,)
        if "://" in text and text.split("://", 1)[0] not in protocols:
            fs, where = resolve(text)
            return fs, where, fs.unstrip_protocol(where)
        fs, where = resolve(text, self._fs)
        return fs, where, to_url(fs, where)

    def _inside(self, fs: AbstractFileSystem, path: str) -> bool:
        """Whether ``path`` is a directory directly inside the run, on the run's filesystem (not a link)."""
        parent, _, name = path.rstrip("/").rpartition("/")
        if fs != self._fs or parent != self._run.rstrip("/") or not is_dir_name(name):
            return False
        return not (is_local(fs) and os.path.islink(path))

    def _write_index(self) -> None:
        inside = to_url(self._fs, self._run).rstrip("/") + "/"

        def stored_path(e: CheckpointEntry) -> str:  # relative inside the run: the run can move
            return e.path[len(inside):] if e.path.startswith(inside) else e.path

        data = {"format": FORMAT, "next_id": self._next_id,
                "config": {"num_to_keep": self.num_to_keep, "score_attribute": self.score_attribute,
                           "score_order": self.score_order},
                "checkpoints": [dict({"name": e.name, "kind": e.kind, "path": stored_path(e), "metrics": e.metrics,
                                      "step": e.step, "time": e.time, "size_bytes": e.size_bytes},
                                     **({"report": e.report} if e.report is not None else {}),
                                     **({"validation": e.validation} if e.validation is not None else {}))
                                for e in self._entries]}
        text = to_json(data, "checkpoint index", error=CheckpointError, indent=1)
        try:
            write_bytes_atomic(self._fs, join(self._run, INDEX_FILE), text.encode("utf-8"))
        except Exception as exc:
            raise CheckpointError(f"cannot write the checkpoint index {self._index_url()} ({describe(exc)}): "
                                  "the index on storage is unchanged; free space or fix access and retry") from exc

    # ------------------------------------------------------------ writing

    def next_name(self, kind: str) -> str:
        """A fresh name: ``snapshot_000001`` or ``checkpoint_000002`` (never reused)."""
        with self._lock:
            check_kind(kind, allow_none=False)
            prefix = "snapshot" if kind == "snapshot" else "checkpoint"
            names = {e.name for e in self._entries}
            while True:
                name = f"{prefix}_{self._next_id:06d}"
                self._next_id += 1
                if name not in names:
                    return name

    def begin(self, kind: str, name: Optional[str] = None) -> StagedDir:
        """Stage a new checkpoint directory in the run; finish with :meth:`commit` or :meth:`abort`.

        Returns:
            The :class:`StagedDir` to write into (picklable: workers can write their files).

        Raises:
            CheckpointError: unknown kind, a bad name, or a name in use.
        """
        check_kind(kind, allow_none=False)
        self._check_new_name(name)
        return begin_dir(self._run, name or self.next_name(kind), filesystem=self._fs)

    def commit(self, staged: StagedDir, kind: str, metrics: Optional[Dict[str, Any]] = None) -> CheckpointEntry:
        """Commit a staged directory in one step and register it; discarded if the commit fails."""
        try:
            commit_dir(staged)
        except BaseException:
            discard_dir(staged)
            raise
        return self.register(staged.name, kind, staged.final_url, metrics)

    def abort(self, staged: StagedDir) -> None:
        """Discard a staged directory (nothing is listed)."""
        discard_dir(staged)

    def persist(self, source: Union[Checkpoint, str], kind: str = "reported",
                metrics: Optional[Dict[str, Any]] = None, name: Optional[str] = None) -> CheckpointEntry:
        """Copy a checkpoint (or a local directory) into the run atomically and register it."""
        ckpt = source if isinstance(source, Checkpoint) else Checkpoint(source)
        staged = self.begin(kind, name)
        try:
            with ckpt.as_directory() as local:
                staged.put_dir(local)
        except BaseException:
            self.abort(staged)
            raise
        return self.commit(staged, kind, metrics)

    def _check_new_name(self, name: Optional[str]) -> None:
        if name is not None and (not isinstance(name, str) or not name):
            raise CheckpointError(f"name={name!r} is not allowed: pass a non-empty string")
        if name is not None and any(e.name == name for e in self._entries):
            raise CheckpointError(f"a checkpoint named {name!r} exists in {self.run_dir}: pick another "
                                  "name or delete it first")

    def register(self, name: str, kind: str, path: Any, metrics: Optional[Dict[str, Any]] = None,
                 report: Optional[int] = None, validation: Optional[Dict[str, Any]] = None) -> CheckpointEntry:
        """Add a committed checkpoint to the index, then prune reported ones beyond ``num_to_keep``.

        Raises:
            CheckpointError: unknown kind, a name in use, a path that is not a committed
                checkpoint, or metrics JSON cannot store.
        """
        with self._lock:
            check_kind(kind, allow_none=False)
            self._check_new_name(name)
            metrics = dict(metrics or {})
            to_json(metrics, "metrics", error=CheckpointError)
            fs, where, url = self._locate(path)
            if not self._inside(fs, where):
                raise CheckpointError(f"checkpoint {to_url(fs, where)} is not a directory directly inside the run "
                                      f"{self.run_dir}: copy it in with persist(), which registers the copy")
            manifest = read_manifest(fs, where)
            if manifest is None:
                raise CheckpointError(f"{to_url(fs, where)} is not a committed checkpoint: write it with "
                                      "begin()/commit() or persist()")
            step = next((metrics[k] for k in STEP_KEYS if isinstance(metrics.get(k), int)
                         and not isinstance(metrics.get(k), bool)), None)
            entry = CheckpointEntry(name=name, kind=kind, path=url, metrics=metrics, step=step, time=time.time(),
                                    size_bytes=int(manifest.get("size_bytes") or 0), report=report,
                                    validation=validation, filesystem=fs)
            before = list(self._entries)
            self._entries.append(entry)
            doomed = self._to_prune(entry)
            self._entries = [e for e in self._entries if e not in doomed]
            try:
                self._write_index()  # index first: a crash now leaves an unlisted dir, never a dangling entry
            except BaseException:
                self._entries = before
                raise
            for e in doomed:
                self._remove_dir(e)
            return entry

    def _rank_key(self, entry: CheckpointEntry) -> tuple:
        order = self._entries.index(entry)
        if self.score_attribute is None:
            return (1, 0.0, order)
        value = score_of(entry.metrics, self.score_attribute)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
            return (0, 0.0, order)  # lacking the score: ranks lowest
        return (1, float(value) if self.score_order == "max" else -float(value), order)

    def _to_prune(self, latest: CheckpointEntry) -> List[CheckpointEntry]:
        reported = [e for e in self._entries if e.kind == "reported"]
        if self.num_to_keep is None or latest.kind != "reported" or len(reported) <= self.num_to_keep:
            return []
        ranked = sorted(reported, key=self._rank_key, reverse=True)  # pending a validation: kept until it is ranked
        return [e for e in ranked[self.num_to_keep:] if e is not latest and (e.validation or {}).get("status")
                != "pending"]

    def _remove_dir(self, entry: CheckpointEntry) -> None:
        """Delete an entry's directory, only if it is one of ours: directly inside the run, committed."""
        fs, path, url = self._locate(entry.path)
        try:
            if not self._inside(fs, path):
                logger.warning("not deleting %s: it is not a directory directly inside the run %s; delete it by "
                               "hand if it is yours", url, self.run_dir)
            elif read_manifest(fs, path) is not None:
                delete_dir(fs, path)
            elif fs.exists(path):
                logger.warning("not deleting %s: it has no commit manifest (%s), so it may not be ours; delete it "
                               "by hand if it is", url, COMMIT_MARKER)
        except FileNotFoundError:
            pass
        except Exception as exc:
            logger.warning("could not delete checkpoint %s: %s", entry.path, describe(exc))

    def delete(self, name: str) -> None:
        """Delete a checkpoint (either kind): from the index, then from storage.

        Raises:
            CheckpointError: no checkpoint has that name (listing those that exist).
        """
        with self._lock:
            entry = self.get(name)
            before = list(self._entries)
            self._entries.remove(entry)
            try:
                self._write_index()
            except BaseException:
                self._entries = before
                raise
            self._remove_dir(entry)

    def update(self, name: str, metrics: Dict[str, Any], validation: Dict[str, Any]) -> Optional[CheckpointEntry]:
        """Merge a validation's ``metrics`` into a checkpoint's, then rank and prune again (None: pruned meanwhile)."""
        with self._lock:
            entry = next((e for e in self._entries if e.name == name), None)
            if entry is None:
                return None
            merged = dict(entry.metrics, **metrics)
            to_json(merged, "metrics", error=CheckpointError)
            before, old = list(self._entries), (entry.metrics, entry.validation)
            entry.metrics, entry.validation = merged, dict(validation)
            newest = self.latest("reported")
            doomed = self._to_prune(newest) if newest is not None else []
            self._entries = [e for e in self._entries if e not in doomed]
            try:
                self._write_index()
            except BaseException:
                self._entries, (entry.metrics, entry.validation) = before, old
                raise
            for e in doomed:
                self._remove_dir(e)
            return entry

    # ------------------------------------------------------------ reading

    def list(self, kind: Optional[str] = None) -> List[CheckpointEntry]:
        """The checkpoints in the order they were registered, optionally of one kind."""
        check_kind(kind)
        return [e for e in self._entries if kind is None or e.kind == kind]

    def latest(self, kind: Optional[str] = None) -> Optional[CheckpointEntry]:
        """The newest checkpoint (of ``kind``), or None.

        Reported checkpoints are newest by report index (``checkpoint_000012`` is newer than
        ``checkpoint_000009`` whenever each was committed: a leftover of a crash may be committed
        late); snapshots, and the newest of either kind, by when they were registered.
        """
        entries = self.list(kind)
        if not entries:
            return None
        if kind == "reported":
            return max(enumerate(entries), key=lambda ie: (entry_report(ie[1]), ie[0]))[1]
        return entries[-1]

    def best(self, n: int = 1) -> List[CheckpointEntry]:
        """The ``n`` best reported checkpoints, best first (by recency without a score)."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise CheckpointError(f"n={n!r} is not allowed: pass a whole number >= 1")
        return sorted(self.list("reported"), key=self._rank_key, reverse=True)[:n]

    def get(self, name_or_index: Union[str, int]) -> CheckpointEntry:
        """A checkpoint by name, or by position in :meth:`list` (``-1`` is the latest).

        Raises:
            CheckpointError: unknown name or index, listing what exists.
        """
        names = [e.name for e in self._entries]
        have = f"the run has {', '.join(names)}" if names else "the run has no checkpoints yet"
        if isinstance(name_or_index, int) and not isinstance(name_or_index, bool):
            if -len(names) <= name_or_index < len(names):
                return self._entries[name_or_index]
            raise CheckpointError(f"checkpoint index {name_or_index} is out of range: {have}")
        for e in self._entries:
            if e.name == name_or_index:
                return e
        raise CheckpointError(f"no checkpoint named {name_or_index!r} in {self.run_dir}: {have}")

    def by_report(self, index: int) -> Optional[CheckpointEntry]:
        """The reported checkpoint of report index ``index`` (whatever its directory's name), or None."""
        return next((e for e in self.list("reported") if entry_report(e) == index), None)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return (f"CheckpointManager({self.run_dir!r}, num_to_keep={self.num_to_keep}, "
                f"score_attribute={self.score_attribute!r}, score_order={self.score_order!r}, "
                f"checkpoints={len(self._entries)})")
