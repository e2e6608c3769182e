"""Files: reading a text file the user named (data, configs, run files) by class, not by case (DESIGN.md "Bad
input"), and writing any output whole or not at all.

- Only a regular file is opened: a folder, a named pipe, a socket or a device is refused from its file type,
  before any read, so nothing blocks on it.
- UTF-8 is read with or without a byte-order mark (spreadsheet tools write one); UTF-16 and UTF-32 are read when
  a byte-order mark says so. Any other bytes are refused in one line naming what they look like.
- Every output is written through a temporary file and a rename (`atomic_write_*`), so a reader sees the old
  file or the new one, never half; an append-only log appends whole lines and fsyncs (`append_jsonl`).
"""

from __future__ import annotations

import codecs
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import yaml

from flexsearch.errors import InputError

_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
         (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))  # UTF-32 LE starts like UTF-16 LE


def file_kind(mode: int) -> str:
    """What a non-regular file is, in words."""
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return name
    return "not a regular file"


def check_regular_file(path: Path) -> None:
    """Refuses a path that is missing or is not a regular file, without opening it."""
    try:
        mode = os.stat(path).st_mode
    except OSError as err:
        if path.is_symlink():
            raise InputError(path, None, None,
                             "a symbolic link that leads nowhere (a loop or a missing target)") from None
        if isinstance(err, FileNotFoundError):
            raise InputError(path, None, None, "file not found") from None
        raise InputError(path, None, None, f"cannot read file ({err.strerror or err})") from None
    if not stat.S_ISREG(mode):
        raise InputError(path, None, None, f"{file_kind(mode)}, not a regular file")


def decode(raw: bytes, path: Path) -> str:
    """The text of a file's bytes (see the module's note), or one InputError naming the encoding it looks like."""
    for bom, encoding in _BOMS:
        if raw.startswith(bom):
            try:
                return raw.decode(encoding)
            except UnicodeDecodeError:
                raise InputError(path, None, None, f"starts with a {encoding.upper()} byte-order mark but is not "
                                                   f"{encoding.upper()} text") from None
    wide = "UTF-16 or UTF-32 without a byte-order mark"
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        head = raw[:4096]
        looks = (wide if head.count(b"\x00") > len(head) // 4
                 else "a legacy 8-bit encoding such as Latin-1 or Windows-1252")
        line = raw[: err.start].count(b"\n") + 1
        raise InputError(path, line, None, f"not UTF-8 text (byte 0x{raw[err.start]:02x}; it looks like {looks}): "
                                           "save it as UTF-8") from None
    if "\x00" in text:  # NUL is valid UTF-8 but no text file holds one: ASCII written as UTF-16 or UTF-32
        at = raw.index(b"\x00")
        raise InputError(path, raw[:at].count(b"\n") + 1, None, f"not UTF-8 text (byte 0x00; it looks like {wide}): "
                                                                "save it as UTF-8")
    return text


def read_text(path: Path) -> str:
    """A regular file's text (see the module's note); every problem is one InputError naming the file."""
    check_regular_file(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise InputError(path, None, None, f"cannot read file ({err.strerror or err})") from None
    return decode(raw, path)


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


def shared_permissions(folder: Path) -> None:
    """Ordinary permissions (as the umask allows) on a folder made with mkdtemp and the files in it."""
    os.chmod(folder, 0o777 & ~_UMASK)
    for path in folder.iterdir():
        if path.is_file():
            os.chmod(path, 0o666 & ~_UMASK)


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


def read_json(path: Path) -> Any:
    """A whole JSON file (score.json...); unreadable or malformed is one InputError."""
    text = read_text(path)
    try:
        return json.loads(text)
    except (json.JSONDecodeError, RecursionError) as err:
        line = getattr(err, "lineno", None)
        raise InputError(path, line, None, "malformed JSON (a damaged or partly written file)") from None


@contextmanager
def exclusive(lock: Path) -> Iterator[None]:
    """Holds an exclusive lock on the file `lock` (made if absent) for the block: another process waits until it is
    done. The kernel drops the lock with its holder, so a killed process never leaves it held."""
    lock.parent.mkdir(parents=True, exist_ok=True)
    with lock.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield
