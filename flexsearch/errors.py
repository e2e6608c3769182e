"""Errors a user can act on. The CLI prints these as one line, without a traceback."""

from __future__ import annotations

import errno
from pathlib import Path

# OSErrors of the machine rather than of a path the user named: exit 1, not 2
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.ENOMEM, errno.EMFILE, errno.ENFILE})
# The most any integer option or setting may be: far beyond what a run can use (a larger one is a typo) and within
# what every file format the run writes holds (Parquet's int32 columns included).
LARGEST = 2**31 - 1


class FlexsearchError(Exception):
    """A problem caused by input or configuration, reported to the user as one line."""


class InputError(FlexsearchError):
    """Bad input data: names the file, the line (1-based, as an editor shows it) and the field."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field, self.message = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{message}")


class ServerUnavailable(Exception):
    """A served model that stopped answering once every retry was spent (the CLI prints it, exit 1): the machine
    or the server, not the input; what finished is kept and a rerun resumes."""


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a long command, with what was kept and how to go on (the CLI prints it, exit 130)."""


def os_error_line(err: OSError) -> tuple[str, int]:
    """An OSError as one line and its exit code (2 for a path the user named, 1 for the machine)."""
    where = f"{err.filename}: " if err.filename else ""
    text = f"{where}{err.strerror or err}"
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        text += "; free space and rerun the same command (a search or evaluate resumes where it stopped)"
    return text, 1 if err.errno in ENVIRONMENT_ERRNOS else 2
