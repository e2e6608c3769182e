"""The run directory (DESIGN.md "Run directory"): its file names, atomic whole-file writes, an
append-only crash-tolerant log, the exclusive lock, which command owns it, and the resume check."""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shlex
import shutil
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import yaml

from flexsearch.data.items import iter_jsonl
from flexsearch.errors import FlexsearchError, InputError
from flexsearch.files import (
    atomic_write_json,
    atomic_write_text,
    atomic_write_yaml,
    check_regular_file,
    read_text,
    shared_permissions,
)
from flexsearch.results.metrics import with_directions
from flexsearch.results.run_files import CONFIG, FILE_DESCRIPTIONS, LOCK, README, SCORE
from flexsearch.results.run_readme import run_readme


def replace_folder(out: Path, fill: Callable[[Path], None]) -> None:
    """Fills a fresh staging folder beside `out`, then puts it in place of `out` in one rename: a
    failure leaves `out` as it was."""
    out.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.", dir=out.parent))
    try:
        fill(staging)
        shared_permissions(staging)
        if out.exists():
            shutil.rmtree(out)
        staging.rename(out)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def portable_path(path: str | Path) -> str:
    """A path as a report or an export shows it: relative to the working directory when under it, else only
    its last part, so no shared file carries the absolute paths of the machine that made it."""
    candidate = Path(path)
    if not candidate.is_absolute():
        return str(path)
    try:
        return str(candidate.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return candidate.name


def check_writable(path: Path, option: str) -> None:
    """Refuses, in one line and before anything is written, an output path that cannot be made: a file or a
    symbolic link that leads nowhere on the way to it, or a folder this process cannot write (read-only
    file system, no permission)."""
    probe = path
    while not probe.exists():
        if probe.is_symlink():
            raise FlexsearchError(f"{option} {path}: {probe} is a symbolic link that leads nowhere")
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe != path and probe.exists() and not probe.is_dir():
        raise FlexsearchError(f"{option} {path}: {probe} is a file, not a folder")
    folder = probe if probe.is_dir() else probe.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        read_only = bool(os.statvfs(folder).f_flag & os.ST_RDONLY)
        reason = "a read-only file system" if read_only else "no permission to write"
        raise FlexsearchError(f"{option} {path}: cannot write in {folder} ({reason})")


def check_output_folder(out: Path, option: str, marker: str, owned: Iterable[str] | None = None) -> None:
    """Ownership of an output folder (DESIGN.md "Run directory"): writing into `out` is allowed when it is
    absent, empty, or flexsearch's own output of this kind: it holds `marker` and, when `owned` is given,
    nothing but those files. Anything else is refused in one line, before anything is written or deleted."""
    check_writable(out, option)
    if not out.exists():
        return
    if not out.is_dir():
        raise FlexsearchError(f"{option} {out}: a file, not a folder")
    names = {p.name for p in out.iterdir()}
    if not names:
        return
    if marker not in names:
        raise FlexsearchError(f"{option} {out}: not empty and not written by flexsearch (no {marker}); it would be "
                              "overwritten: choose another folder")
    foreign = sorted(names - set(owned)) if owned is not None else []
    if foreign:
        raise FlexsearchError(f"{option} {out}: holds {foreign[0]}, which flexsearch did not write; it would be "
                              "lost: move it or choose another folder")


def check_output_file(path: Path, option: str, signature: str) -> None:
    """Refuses to overwrite an existing file unless it is flexsearch's own (it contains `signature`)."""
    check_writable(path, option)
    if not path.exists():
        return
    if not path.is_file():
        raise FlexsearchError(f"{option} {path}: not a file")
    try:
        head = path.read_text(encoding="utf-8", errors="replace")[:4096]
    except OSError as err:
        raise FlexsearchError(f"{option} {path}: cannot read it ({err.strerror})") from None
    if signature not in head:
        raise FlexsearchError(f"{option} {path}: exists and was not written by flexsearch; it would be overwritten: "
                              "choose another name")


def read_log(path: Path, repair: bool = False) -> list[dict[str, Any]]:
    """Records of an append-only log.

    A torn last line (a kill mid-write) is dropped; only a resuming writer (`repair=True`) cuts it
    off the file. An unreadable line before the end is an InputError naming the file and line, and
    the file is left as it is: read-only commands never rewrite a log."""
    if not path.exists() and not path.is_symlink():
        return []
    check_regular_file(path)
    raw = path.read_bytes()
    lines = raw.splitlines(keepends=True)
    records, good_bytes = [], 0
    for number, line in enumerate(lines, start=1):
        last = number == len(lines)
        try:
            record = json.loads(line) if line.endswith(b"\n") or not last else None
        except (json.JSONDecodeError, UnicodeDecodeError, RecursionError):
            record = None
            if not last:
                raise InputError(path, number, None, "unreadable record in the middle of the log; "
                                                     "the file was left unchanged") from None
        if record is None:
            break  # the torn tail
        if not isinstance(record, dict):
            raise InputError(path, number, None, "expected a JSON object")
        records.append(record)
        good_bytes += len(line)
    if repair and good_bytes != len(raw):
        with path.open("r+b") as handle:
            handle.truncate(good_bytes)
    return records


_TRACE_FIELDS: dict[str, tuple[type, ...]] = {  # an item record's fields and the JSON types each may hold
    "objective": (str,), "item_id": (str,), "chain": (list,), "option_order": (list,), "clean_probs": (list,),
    "best_probs": (list,), "success": (bool,), "queries": (int,), "first_success_query": (int, type(None)),
}


def config_fingerprint(resolved: dict[str, Any], command: str = "search") -> str:
    """A short hash of the settings that decide a command's results (RESULT_KEYS): every trace record carries
    it, so a resume never mixes records written under another configuration."""
    chosen = {key: _dotted(resolved, key) for key in RESULT_KEYS[command]}
    return hashlib.sha256(json.dumps(chosen, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_trace(path: Path, repair: bool = False, fingerprint: str | None = None) -> list[dict[str, Any]]:
    """The item records of a search's trace.jsonl (read_log), each checked for the fields a resume, compare
    and report read: a missing or mistyped field, or (with `fingerprint`) a record written under another
    configuration, is an InputError naming the line and the field; the file is left as it is."""
    records = []
    for line, record in enumerate(read_log(path, repair=repair), start=1):
        if record.get("kind") != "item":
            continue
        if fingerprint is not None and record.get("config", fingerprint) != fingerprint:
            raise InputError(path, line, "config", f"written under another configuration ({record['config']}, this "
                                                   f"run is {fingerprint}); resume with the same settings or choose "
                                                   "another --out")
        for field, types in _TRACE_FIELDS.items():
            if field not in record:
                raise InputError(path, line, field, "missing field (a damaged or foreign trace; the file was left "
                                                    "unchanged)")
            if not isinstance(record[field], types) or (bool in types) != isinstance(record[field], bool):
                raise InputError(path, line, field, f"unexpected value {str(record[field])[:40]!r}")
        if any(len(record[f]) != 3 for f in ("option_order", "clean_probs", "best_probs")):
            raise InputError(path, line, "best_probs", "expected three answers' values")
        records.append(record)
    return records


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Every record of a whole JSONL file (split.jsonl, predictions.jsonl); a bad line is an InputError."""
    return [record for _, record in iter_jsonl(path)]


# ---------------------------------------------------------------- the run directory


SCORE_SCHEMA_VERSION = 2  # 2: provenance fields, metric directions
# Settings that change results, per command: a resumed (or repeated) run must match on each.
_MODEL_KEYS = ("model.model", "model.adapter", "model.dtype", "model.revision", "model.gguf_sha256",
               "model.served", "model.server_model_id")
RESULT_KEYS = {
    "search": ("data", "data_sha256", "limit", "scoring", "search", "prior", *_MODEL_KEYS),
    "evaluate": ("data", "split", "data_sha256", "limit", "scoring", *_MODEL_KEYS),
}
# known only once the model has loaded (its file is hashed then) or the server has been asked (its models, the
# scoring mode --served-mode auto finds)
_LOADED_ONLY = ("model.gguf_sha256", "model.server_model_id", "model.served")


def _dotted(data: dict[str, Any], key: str) -> Any:
    value: Any = data
    for part in key.split("."):
        value = value.get(part) if isinstance(value, dict) else None
    return value


def differing_keys(previous: dict[str, Any], current: dict[str, Any], keys: tuple[str, ...]) -> list[str]:
    """The keys whose values differ, with nested differences (inside `search`, say) spelled out."""
    found = []
    for key in keys:
        before, after = _dotted(previous, key), _dotted(current, key)
        if before == after:
            continue
        if isinstance(before, dict) and isinstance(after, dict):
            found += [f"{key}.{k}" for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]
        else:
            found.append(key)
    return found


def read_run_config(run: Path) -> dict[str, Any] | None:
    """A run directory's config.yaml (None when it has none); unreadable is one InputError."""
    path = run / CONFIG
    if not path.exists() and not path.is_symlink():
        return None
    try:
        data = yaml.safe_load(read_text(path))
    except yaml.YAMLError:
        raise InputError(path, None, None, "unreadable run configuration") from None
    if not isinstance(data, dict):
        raise InputError(path, None, None, "unreadable run configuration")
    return data


class RunDirectory:
    """One command's run directory: refuses a file, another command's run, a different run's
    settings and a second process, before anything in it changes."""

    def __init__(self, path: Path, command: str) -> None:
        self.path, self.command = path, command
        self._fd: int | None = None
        self._created = False
        if path.exists() and not path.is_dir():
            raise FlexsearchError(f"--out {path}: a file, not a run directory")
        check_writable(path, "--out")

    def previous_config(self) -> dict[str, Any] | None:
        return read_run_config(self.path)

    def check(self, resolved: dict[str, Any], model_loaded: bool = False) -> bool:
        """True when the directory holds this command's run with the same settings (resume); raises
        when it holds another command's run or other settings; False when it holds no run. Before
        the model loads, the keys only a loaded model knows are left for a second check."""
        keys = tuple(k for k in RESULT_KEYS[self.command] if model_loaded or k not in _LOADED_ONLY)
        previous = self.previous_config()
        if previous is None:
            if self.path.is_dir() and any(p.name != LOCK for p in self.path.iterdir()):
                raise FlexsearchError(f"--out {self.path}: not empty and not a flexsearch run directory")
            return False
        if previous.get("command") != self.command:
            raise FlexsearchError(f"--out {self.path}: holds a '{previous.get('command')}' run; "
                                  f"'{self.command}' writes its own run directory (choose another --out)")
        differing = differing_keys(previous, resolved, keys)
        if differing:
            raise FlexsearchError(f"--out {self.path}: holds a run with different settings ({', '.join(differing)}); "
                                  "resume with the same settings or choose another --out")
        return True

    def __enter__(self) -> RunDirectory:
        """Takes the exclusive lock (released when the process ends, even by kill -9)."""
        self._created = not self.path.exists()
        self.path.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDONLY)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            holder = (self.path / LOCK).read_text(encoding="utf-8").strip() if (self.path / LOCK).exists() else "?"
            raise FlexsearchError(f"--out {self.path}: in use by another flexsearch process (pid {holder})") from None
        self._fd = fd
        (self.path / LOCK).write_text(f"{os.getpid()}\n", encoding="utf-8")
        return self

    def __exit__(self, *exc: object) -> None:
        (self.path / LOCK).unlink(missing_ok=True)
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._created and exc[0] is not None and {p.name for p in self.path.iterdir()} <= {CONFIG, README}:
            shutil.rmtree(self.path)  # a command that failed before any result leaves no directory behind

    def write_config(self, resolved: dict[str, Any]) -> None:
        atomic_write_yaml(self.path / CONFIG, resolved)
        atomic_write_text(self.path / README, run_readme(self.command))

    def write_score(self, score: dict[str, Any], started: float) -> dict[str, Any]:
        """Writes score.json with its provenance header; returns what was written."""
        full = {"schema_version": SCORE_SCHEMA_VERSION, "command": self.command,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "duration_s": round(time.time() - started, 1),
                "invocation": " ".join(shlex.quote(a) for a in [Path(sys.argv[0]).name, *sys.argv[1:]]),
                "versions": software_versions(), **with_directions(score)}
        atomic_write_json(self.path / SCORE, full)
        present = [p.name for p in self.path.iterdir()]
        atomic_write_text(self.path / README, run_readme(self.command, present, full))
        return full

    def files(self) -> dict[str, Path]:
        """Name → path of every result file the directory holds."""
        return {name: self.path / name for name in FILE_DESCRIPTIONS if name != LOCK and (self.path / name).is_file()}


def software_versions() -> dict[str, str]:
    import platform

    import torch
    import transformers

    from flexsearch.version import __version__

    return {"flexsearch": __version__, "torch": str(torch.__version__),
            "transformers": transformers.__version__, "python": platform.python_version()}
