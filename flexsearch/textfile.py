"""Reading a text file the user named (data, configs, run files): by class, not by case (DESIGN.md "Bad input").

- Only a regular file is opened: a folder, a named pipe, a socket or a device is refused from its file type,
  before any read, so nothing blocks on it.
- UTF-8 is read with or without a byte-order mark (spreadsheet tools write one); UTF-16 and UTF-32 are read when
  a byte-order mark says so. Any other bytes are refused in one line naming what they look like.
"""

from __future__ import annotations

import codecs
import os
import stat
from pathlib import Path

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
