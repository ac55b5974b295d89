"""W&B's offline run files read back: each ``run-<id>.wandb`` is a log of protobuf ``Record``s in LevelDB's log
format (32 KiB blocks of 7-byte-headed chunks) after a 7-byte ``:W&B`` header; parsed with W&B's own protobufs."""
from __future__ import annotations

import dataclasses
import json
import pathlib
import struct
import time
from typing import Any, Dict, Iterator, List

BLOCK = 32 * 1024
HEADER = 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def records(path: pathlib.Path) -> Iterator[Any]:
    """Every record of one ``.wandb`` file, in order."""
    from wandb.proto import wandb_internal_pb2 as pb  # W&B's own message definitions

    data = path.read_bytes()
    assert data[:4] == b":W&B", f"{path} is not a W&B run file: {data[:7]!r}"
    pos, parts = HEADER, b""
    while pos + HEADER <= len(data):
        left = BLOCK - pos % BLOCK
        if left < HEADER:  # the rest of a block too small for a chunk header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + HEADER])
        if kind == 0 and length == 0:
            pos += left
            continue
        if pos + HEADER + length > len(data):  # a chunk still being written
            return
        chunk = data[pos + HEADER:pos + HEADER + length]
        pos += HEADER + length
        parts = chunk if kind in (FULL, FIRST) else parts + chunk
        if kind in (FULL, LAST):
            record = pb.Record()
            record.ParseFromString(parts)
            yield record


@dataclasses.dataclass
class Segment:
    """What one process segment (one ``offline-run-*`` folder) logged."""

    folder: str
    run_ids: List[str]
    history: List[Dict[str, Any]]  # one dict per logged row, with "_step"
    tags: List[str]
    notes: str
    config: Dict[str, Any]
    artifacts: List[str]


def finished_records(folder: pathlib.Path, deadline_s: float = 30.0) -> List[Any]:
    """The records of the segment in ``folder`` once its file ends with the ``exit`` record ``finish()`` writes
    (W&B's service writes the file on its own process: it may still be writing when ``finish()`` has returned)."""
    deadline = time.monotonic() + deadline_s
    while True:
        paths = list(folder.glob("*.wandb"))
        got = list(records(paths[0])) if len(paths) == 1 else []
        if got and got[-1].WhichOneof("record_type") == "exit":
            return got
        if time.monotonic() > deadline:
            kinds = [r.WhichOneof("record_type") for r in got]
            raise AssertionError(f"{folder}: no finished W&B run file after {deadline_s:.0f} s (files {paths}, "
                                 f"records {kinds})")
        time.sleep(0.05)  # polling the service's file for the condition, with the deadline above


def read_segment(folder: pathlib.Path) -> Segment:
    seg = Segment(folder.name, [], [], [], "", {}, [])
    for record in finished_records(folder):
        kind = record.WhichOneof("record_type")
        if kind == "run":  # the run's record (and its updates): id, tags, notes, the config given to init
            seg.run_ids.append(record.run.run_id)
            seg.tags, seg.notes = list(record.run.tags) or seg.tags, record.run.notes or seg.notes
            for item in record.run.config.update:
                seg.config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "history":
            seg.history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                for item in record.history.item})
        elif kind == "config":
            for item in record.config.update:
                seg.config[item.key or "/".join(item.nested_key)] = json.loads(item.value_json)
        elif kind == "artifact":
            seg.artifacts.append(record.artifact.name)
    return seg


def read_segments(wandb_dir: pathlib.Path) -> List[Segment]:
    """Every offline segment under ``<dir>/wandb``, in the order they were written."""
    folders = sorted((wandb_dir / "wandb").glob("offline-run-*"), key=lambda p: (p.name, p.stat().st_mtime))
    return [read_segment(f) for f in folders]
