"""The on-disk request cache of served targets: a resumed or repeated run never pays for a reply twice."""

from __future__ import annotations

import hashlib
import json
import sqlite3
from collections.abc import Sequence
from typing import Any

from flexsearch.scoring.model import cache_root


class RequestCache:
    """Request → reply, on disk (SQLite, one file under the flexsearch cache), shared by every run on this
    machine. Keys hash the server's host and model id and the whole request body."""

    def __init__(self, enabled: bool) -> None:
        self._db: sqlite3.Connection | None = None
        if enabled:
            path = cache_root() / "served-requests.sqlite"
            path.parent.mkdir(parents=True, exist_ok=True)
            # used from one thread at a time, not always the one that opened it (run_to_completion)
            self._db = sqlite3.connect(path, timeout=60, check_same_thread=False)
            self._db.execute("CREATE TABLE IF NOT EXISTS reply (key TEXT PRIMARY KEY, value TEXT NOT NULL)")

    @staticmethod
    def key(scope: Sequence[str], body: dict[str, Any]) -> str:
        return hashlib.sha256(json.dumps([*scope, body], sort_keys=True).encode()).hexdigest()

    def get(self, key: str) -> dict[str, Any] | None:
        if self._db is None:
            return None
        row = self._db.execute("SELECT value FROM reply WHERE key = ?", (key,)).fetchone()
        return json.loads(row[0]) if row else None

    def put(self, key: str, value: dict[str, Any]) -> None:
        if self._db is not None:
            self._db.execute("INSERT OR REPLACE INTO reply VALUES (?, ?)", (key, json.dumps(value)))
            self._db.commit()  # each reply is kept as it arrives: a server lost mid-batch costs only the rest
