"""Errors a user can act on. The CLI prints these as one line, without a traceback."""

from __future__ import annotations

from pathlib import Path


class FlexsearchError(Exception):
    """A problem caused by input or configuration, reported to the user as one line."""


class InputError(FlexsearchError):
    """Bad input data: names the file, the line (1-based, as an editor shows it) and the field."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str) -> None:
        self.path, self.line, self.field, self.message = str(path), line, field, message
        where = self.path if line is None else f"{self.path}:{line}"
        what = f"field '{field}': " if field else ""
        super().__init__(f"{where}: {what}{message}")


class Interrupted(KeyboardInterrupt):
    """Ctrl-C during a long command, with what was kept and how to go on (the CLI prints it, exit 130)."""
