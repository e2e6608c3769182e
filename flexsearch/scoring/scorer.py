"""Answer scoring (DESIGN.md "Scoring", "Scoring backends"): a Scorer over a backend.

The Scorer renders each candidate in its option orders, averages the orders when asked, serves repeated prompts
from a cache keyed by the rendered text and counts every prompt it scores (the budget's unit); its backend
(`backends/`, picked by the model spec's prefix) turns prompts into P(A), P(B), P(C).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from flexsearch.config import ScoringConfig, prompts_per_candidate
from flexsearch.data.candidate import Candidate
from flexsearch.data.items import Item
from flexsearch.data.render import PromptFormat, cyclic_orders
from flexsearch.errors import FlexsearchError
from flexsearch.scoring.backends.base import BACKENDS, ScoringBackend, backend_name, load_backends
from flexsearch.scoring.backends.in_process import InProcessBackend
from flexsearch.scoring.model import TargetModel


@dataclass
class Scores:
    """Answer distributions for a list of candidates."""

    probs: np.ndarray  # (N, 3): P(answer index), averaged over option orders when asked
    letters: np.ndarray  # (N, orders, 3): P(A), P(B), P(C) of each rendered prompt, for letter bias


class Scorer:
    """Scores candidates on a backend: renders each in its option orders, averages the orders when asked,
    serves repeated prompts from a cache and counts every prompt it scores (the search budget's unit)."""

    def __init__(self, backend: ScoringBackend, *, average_orders: bool = False) -> None:
        self.backend = backend
        self.average_orders = average_orders
        self.queries = 0  # budget units spent: prompts scored × the backend's cost per prompt (cache hits are free)
        self._cache: dict[str, np.ndarray] = {}

    @classmethod
    def in_process(cls, target: TargetModel, fmt: PromptFormat | None = None, *, average_orders: bool = False,
                   **settings: Any) -> Scorer:
        """A scorer over a loaded model (`settings`: InProcessBackend's batch and prefix options)."""
        return cls(InProcessBackend(target, fmt, **settings), average_orders=average_orders)

    @classmethod
    def from_config(cls, target: TargetModel, scoring: ScoringConfig) -> Scorer:
        """The scorer a search config asks for over a loaded model, with an empty cache."""
        return cls(InProcessBackend.from_config(target, scoring), average_orders=scoring.average_orders)

    def fresh(self) -> Scorer:
        """The same backend with an empty cache and count (a tuning trial pays for its own prompts)."""
        return Scorer(self.backend, average_orders=self.average_orders)

    @property
    def target(self) -> TargetModel | None:
        return self.backend.white_box

    @property
    def fmt(self) -> PromptFormat:
        return self.backend.fmt

    @property
    def info(self) -> dict[str, Any]:
        return self.backend.info

    @property
    def max_prompt_tokens(self) -> int:
        return self.backend.max_prompt_tokens

    @property
    def queries_per_candidate(self) -> int:
        return prompts_per_candidate(self.average_orders) * self.backend.queries_per_prompt

    def render(self, candidate: Candidate) -> str:
        return self.backend.render(candidate)

    def served_usage(self) -> dict[str, Any]:
        """score.json's `usage` (requests, tokens, retries, cache hits) for a served target; nothing in process."""
        usage = self.backend.usage()
        return {"usage": usage} if usage else {}

    def prompts(self, candidate: Candidate, displayed_only: bool = False) -> list[tuple[str, tuple[int, int, int]]]:
        averaged = self.average_orders and not displayed_only
        orders = cyclic_orders(candidate.option_order) if averaged else [candidate.option_order]
        return [(self.backend.render(_reordered(candidate, order)), order) for order in orders]

    def fits(self, candidate: Candidate, margin: int = 0) -> bool:
        lengths = [self.backend.prompt_tokens(p) for p, _ in self.prompts(candidate)]
        return all(n is None or n + margin <= self.max_prompt_tokens for n in lengths)

    def score(self, candidates: Sequence[Candidate], displayed_only: bool = False) -> Scores:
        """Answer distributions, averaged over the option orders when asked; `displayed_only`: from each candidate's
        displayed order alone (one prompt each; the search's screen, engine.loop.screened)."""
        rendered = [self.prompts(c, displayed_only) for c in candidates]
        flat = [prompt for per_candidate in rendered for prompt, _ in per_candidate]
        missing = list(dict.fromkeys(p for p in flat if p not in self._cache))
        if missing:
            for prompt, row in zip(missing, self.letter_probs_uncached(missing), strict=True):
                self._cache[prompt] = row
        probs = np.zeros((len(candidates), 3))
        letters = np.array([[self._cache[p] for p, _ in per_candidate] for per_candidate in rendered])
        for i, per_candidate in enumerate(rendered):
            for prompt, order in per_candidate:
                for slot, answer in enumerate(order):
                    probs[i, answer] += self._cache[prompt][slot] / len(per_candidate)
        return Scores(probs=probs, letters=letters.reshape(len(candidates), -1, 3))

    def letter_probs_uncached(self, prompts: Sequence[str]) -> np.ndarray:
        """P(A), P(B), P(C) for each prompt, counted against the budget; no caching."""
        result = self.backend.letter_probs(prompts)
        self.queries += len(prompts) * self.backend.queries_per_prompt
        return result


def build_scorer(target: dict[str, Any], scoring: dict[str, Any]) -> Scorer:
    """The scorer a command asks for: `target` holds the model spec and its options (api.Target.arguments:
    a served model's when it names one, load_target's otherwise), `scoring` a ScoringConfig's fields."""
    config = ScoringConfig(**scoring)
    return Scorer(build_backend(target, config), average_orders=config.average_orders)


def build_backend(target: dict[str, Any], scoring: ScoringConfig) -> ScoringBackend:
    """The backend the model spec asks for (`backend_name`), connected: a server reached or a model loaded."""
    load_backends()
    arguments = {k: v for k, v in target.items() if v is not None}  # an option left unset takes its default
    return BACKENDS.get(backend_name(arguments["model"])).connect(arguments, scoring)


def _reordered(candidate: Candidate, order: tuple[int, int, int]) -> Candidate:
    return candidate if order == candidate.option_order else replace(candidate, option_order=order)


def fit_context(items: Sequence[Item], scorer: Scorer, margin: int) -> tuple[list[Item], Counter[str]]:
    """Items whose clean prompt, plus `margin` tokens for mutations, fits the scorer's limit; the
    others are skipped and counted (never run: a prompt past the context is garbage and slow)."""
    kept, skipped = [], Counter[str]()
    for item in items:
        if scorer.fits(Candidate.root(item), margin):
            kept.append(item)
        else:
            skipped[f"prompt longer than {scorer.max_prompt_tokens - margin} tokens "
                    f"(context {scorer.max_prompt_tokens}, {margin} kept for mutations)"] += 1
    if not kept:
        raise FlexsearchError(f"every item's prompt is longer than {scorer.max_prompt_tokens - margin} tokens "
                              "(the model's context, or scoring.max_prompt_tokens)")
    return kept, skipped
