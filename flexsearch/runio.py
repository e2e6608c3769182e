"""Run-directory I/O: atomic whole-file writes and an append-only, crash-tolerant JSONL log."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml

_UMASK = os.umask(0o022)
os.umask(_UMASK)  # read once: the process umask, to give written files ordinary permissions


def atomic_write_text(path: Path, text: str) -> None:
    """Writes via a temporary file and rename, so readers see the old or the new file, never half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes owner-only files; outputs are for sharing
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_json(path: Path, data: Any) -> None:
    atomic_write_text(path, json.dumps(data, indent=2, sort_keys=False) + "\n")


def atomic_write_yaml(path: Path, data: Any) -> None:
    atomic_write_text(path, yaml.safe_dump(data, sort_keys=False, allow_unicode=True))


def atomic_write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    atomic_write_text(path, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records))


def append_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> None:
    """Appends records in one write and fsyncs: after a crash a line is whole or absent (see read_log)."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())


def read_log(path: Path) -> list[dict[str, Any]]:
    """Records of an append-only log; a torn last line (a kill mid-write) is dropped and cut off."""
    if not path.exists():
        return []
    raw = path.read_bytes()
    records, good_bytes = [], 0
    for line in raw.splitlines(keepends=True):
        if not line.endswith(b"\n"):
            break
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
        good_bytes += len(line)
    if good_bytes != len(raw):
        with path.open("r+b") as handle:
            handle.truncate(good_bytes)
    return records
