"""What a served target cost: requests, tokens, retries and cache hits, gathered per process and merged (a Ray
worker reports its share)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from flexsearch.data.render import LETTERS


@dataclass
class Usage:
    """What the served scoring cost and how the answers read (score.json `usage`)."""

    requests: int = 0  # answered over the network
    cache_hits: int = 0
    retries: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0  # of those, what the server reports it took from its key/value cache
    completion_tokens: int = 0
    request_seconds: float = 0.0  # wall time spent waiting for batches of requests
    bounded_prompts: int = 0  # logprob modes: a letter missing from the top-k, bounded by the smallest logprob
    covered_mass: list[float] = field(default_factory=list)  # logprob modes: per prompt scored
    answers: dict[str, int] = field(default_factory=lambda: {**dict.fromkeys(LETTERS, 0), "refusal": 0,
                                                             "unparseable": 0})  # sample mode
    no_answer_prompts: int = 0  # sample mode: no sample gave a letter (scored uniform)

    def merge(self, counters: dict[str, Any]) -> None:
        """Adds another Usage's fields (dataclasses.asdict of it)."""
        for name, value in counters.items():
            mine = getattr(self, name)
            if isinstance(mine, dict):
                for key, count in value.items():
                    mine[key] = mine.get(key, 0) + count
            elif isinstance(mine, list):
                mine.extend(value)
            else:
                setattr(self, name, mine + value)

    def to_dict(self, mode: str) -> dict[str, Any]:
        found: dict[str, Any] = {"requests": self.requests, "cache_hits": self.cache_hits, "retries": self.retries,
                                 "prompt_tokens": self.prompt_tokens, "cached_prompt_tokens": self.cached_prompt_tokens,
                                 "completion_tokens": self.completion_tokens,
                                 "request_seconds": round(self.request_seconds, 2)}
        if mode == "sample":
            samples = sum(self.answers.values())
            found.update(samples=samples, answers=self.answers, no_answer_prompts=self.no_answer_prompts,
                         refusal_rate=round(self.answers["refusal"] / samples, 4) if samples else None)
        else:
            mass = np.array(self.covered_mass) if self.covered_mass else np.zeros(1)
            found.update(bounded_prompts=self.bounded_prompts, covered_mass={
                "prompts": len(self.covered_mass), "mean": round(float(mass.mean()), 4),
                "min": round(float(mass.min()), 4), "below_0_5": int((mass < 0.5).sum())})
        return found
