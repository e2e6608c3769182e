"""A served target's options (api.Target fields, the CLI's --base-url, --served-mode, --top-logprobs...) and their
defaults: one table for flexsearch.served, the typed API and the CLI, in a module of its own so that the CLI
declares its options without importing the HTTP client (`flexsearch --help` starts at once)."""

from __future__ import annotations

from typing import Any

SERVED_DEFAULTS: dict[str, Any] = {"base_url": None, "served_mode": None, "top_logprobs": 5, "samples": 8,
                                   "temperature": 1.0, "concurrency": 4, "request_timeout": 60.0, "retries": 5,
                                   "request_cache": True}
