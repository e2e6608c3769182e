"""flexsearch: adversarial prompt search for LLM fairness robustness.

    import flexsearch
    result = flexsearch.search("seed", model="gemma3-bbq", budget=16, limit=6, out="runs/api-demo")
    result.score.asr, result.score.verdict, result.rows[0]["prompt"], result.files["split.jsonl"]

`search`, `evaluate` and `compare` live in flexsearch.api; they load on first use, so importing the
package (or `flexsearch --version`) stays fast.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from flexsearch.version import __version__

__all__ = ["Comparison", "Difference", "RayOptions", "Rate", "RunResult", "Score", "Target", "__version__", "audit",
           "compare", "evaluate", "search"]

if TYPE_CHECKING:
    from flexsearch.api import RayOptions, Target, audit, compare, evaluate, search
    from flexsearch.results import Comparison, Difference, Rate, RunResult, Score

_API = ("search", "evaluate", "compare", "audit", "Target", "RayOptions")
_RESULTS = ("Score", "Rate", "Difference", "RunResult", "Comparison")


def __getattr__(name: str) -> Any:
    if name in _API:
        from flexsearch import api

        return getattr(api, name)
    if name in _RESULTS:
        from flexsearch import results

        return getattr(results, name)
    raise AttributeError(f"module 'flexsearch' has no attribute {name!r}")
