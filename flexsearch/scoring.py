"""One-pass answer scoring (DESIGN.md "Scoring").

Each rendered prompt gets one forward pass; the next-token distribution at the answer position,
restricted to the three option-letter tokens and renormalised, is mapped back through the option
order to P(answer). Prompts are deduplicated by a cache keyed by the rendered text; prompts that
share a long token prefix (an instruction template, a context) compute that prefix's key/value
cache once and score only their suffixes.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch

from flexsearch.candidate import Candidate
from flexsearch.config import ScoringConfig, prompts_per_candidate
from flexsearch.errors import FlexsearchError
from flexsearch.items import Item
from flexsearch.model import TargetModel, load_target
from flexsearch.render import PromptFormat, cyclic_orders, letter_token_ids, render


@dataclass
class Scores:
    """Answer distributions for a list of candidates."""

    probs: np.ndarray  # (N, 3): P(answer index), averaged over option orders when asked
    letters: np.ndarray  # (N, orders, 3): P(A), P(B), P(C) of each rendered prompt, for letter bias


def shared_prefix_groups(sequences: Sequence[Sequence[int]], min_prefix: int,
                         min_saving: float = 0.0) -> list[tuple[int, list[int]]]:
    """Groups sequence indices that share a token prefix of at least `min_prefix` tokens.

    A group is kept only when its shared prefix saves at least `min_saving` of the group's tokens:
    each group costs a forward pass of its own and smaller batches, so a short prefix shared by a
    few prompts is cheaper to recompute. Returns (prefix length, indices) pairs; prefix length 0
    means "score the full sequences" (one group gathers all prompts left without a worthwhile
    prefix). The prefix always leaves at least one token of every member to score.
    """
    order = sorted(range(len(sequences)), key=lambda i: tuple(sequences[i]))
    groups: list[tuple[int, list[int]]] = []
    for index in order:
        seq = sequences[index]
        if groups:
            prefix_len, members = groups[-1]  # a lone member's "prefix" is all but its last token
            first = sequences[members[0]]
            limit = min(prefix_len, len(seq) - 1)
            common = 0
            while common < limit and first[common] == seq[common]:
                common += 1
            # Join when the group then saves at least as many tokens as before: a long prefix shared
            # by many prompts is not traded for a short one shared by one more.
            if common >= min_prefix and common * len(members) >= prefix_len * (len(members) - 1):
                groups[-1] = (common, [*members, index])
                continue
        groups.append((len(seq) - 1, [index]))
    def worthwhile(prefix_len: int, members: list[int]) -> bool:
        saved = prefix_len * (len(members) - 1)
        return len(members) > 1 and saved >= min_saving * sum(len(sequences[i]) for i in members)

    shared = [(p, members) for p, members in groups if worthwhile(p, members)]
    alone = [i for p, members in groups if not worthwhile(p, members) for i in members]
    return shared + ([(0, alone)] if alone else [])  # prompts with no partner batch together


class Scorer:
    """Renders candidates and returns their answer distributions; counts every prompt it scores."""

    def __init__(
        self,
        target: TargetModel,
        fmt: PromptFormat | None = None,
        *,
        batch_size: int = 16,
        average_orders: bool = False,
        prefix_reuse: bool = True,
        min_shared_prefix: int = 16,
        min_prefix_saving: float = 0.5,
        max_prompt_tokens: int = 0,
    ) -> None:
        self.target = target
        self.fmt = fmt or PromptFormat()
        self.batch_size = batch_size
        self.average_orders = average_orders
        self.prefix_reuse = prefix_reuse
        self.min_shared_prefix = min_shared_prefix
        self.min_prefix_saving = min_prefix_saving
        self.letter_ids = letter_token_ids(target.tokenizer, self.fmt.answer_prefix)
        self._prefix_tail = target.tokenizer.encode(self.fmt.answer_prefix, add_special_tokens=False)[-1]
        context = getattr(target.model.config, "max_position_embeddings", None) or 1 << 30
        self.max_prompt_tokens = min(context, max_prompt_tokens) if max_prompt_tokens > 0 else context
        self.queries = 0  # prompts forwarded through the model (cache hits are free)
        self._cache: dict[str, np.ndarray] = {}

    @classmethod
    def from_config(cls, target: TargetModel, scoring: ScoringConfig) -> Scorer:
        """The scorer a search config asks for, with an empty cache."""
        return cls(target, PromptFormat(mode=scoring.mode), batch_size=scoring.batch_size,
                   average_orders=scoring.average_orders, prefix_reuse=scoring.prefix_reuse,
                   max_prompt_tokens=scoring.max_prompt_tokens)

    @property
    def prompts_per_candidate(self) -> int:
        return prompts_per_candidate(self.average_orders)

    def prompts(self, candidate: Candidate) -> list[tuple[str, tuple[int, int, int]]]:
        orders = cyclic_orders(candidate.option_order) if self.average_orders else [candidate.option_order]
        tokenizer = self.target.tokenizer
        return [(render(_reordered(candidate, order), tokenizer, self.fmt), order) for order in orders]

    def prompt_tokens(self, candidate: Candidate) -> int:
        """The longest of the candidate's rendered prompts, in tokens."""
        add_special = self.fmt.mode == "plain"
        return max(len(self.target.tokenizer.encode(p, add_special_tokens=add_special))
                   for p, _ in self.prompts(candidate))

    def fits(self, candidate: Candidate, margin: int = 0) -> bool:
        return self.prompt_tokens(candidate) + margin <= self.max_prompt_tokens

    def score(self, candidates: Sequence[Candidate]) -> Scores:
        rendered = [self.prompts(c) for c in candidates]
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
        """P(A), P(B), P(C) for each prompt (letters in displayed order); no caching."""
        add_special = self.fmt.mode == "plain"  # a chat template already holds its special tokens
        sequences = [self.target.tokenizer.encode(p, add_special_tokens=add_special) for p in prompts]
        for prompt, seq in zip(prompts, sequences, strict=True):
            if seq[-1] != self._prefix_tail:
                raise FlexsearchError(f"prompt does not end in the answer prefix token: ...{prompt[-40:]!r}")
        result = np.zeros((len(sequences), 3))
        everything = [(0, list(range(len(sequences))))]
        groups = (shared_prefix_groups(sequences, self.min_shared_prefix, self.min_prefix_saving)
                  if self.prefix_reuse else everything)
        for prefix_len, members in groups:
            members = sorted(members, key=lambda i: len(sequences[i]))  # similar lengths → little padding
            prefix_cache = self._prefix_cache(sequences[members[0]][:prefix_len]) if prefix_len else None
            suffixes = [sequences[i][prefix_len:] for i in members]
            result[members] = self._run_batches(prefix_cache, prefix_len, suffixes)
        self.queries += len(sequences)
        return result

    @torch.inference_mode()
    def _prefix_cache(self, prefix: list[int]):
        ids = torch.tensor([prefix], device=self.target.device)
        return self.target.model(input_ids=ids, use_cache=True).cache

    def _run_batches(self, prefix_cache, prefix_len: int, suffixes: list[list[int]]) -> np.ndarray:
        """Scores suffixes in batches, halving the batch size on out-of-memory."""
        out: list[np.ndarray] = []
        start = 0
        while start < len(suffixes):
            chunk = suffixes[start : start + self.batch_size]
            try:
                out.append(self._run(prefix_cache, prefix_len, chunk))
            except torch.OutOfMemoryError:
                if self.batch_size == 1:
                    raise
                self.batch_size //= 2
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
                continue
            start += len(chunk)
        return np.concatenate(out)

    @torch.inference_mode()
    def _run(self, prefix_cache, prefix_len: int, suffixes: list[list[int]]) -> np.ndarray:
        device = self.target.device
        ids, mask, positions = left_padded(suffixes, self.target.tokenizer.pad_token_id, prefix_len)
        cache = None
        if prefix_cache is not None:
            cache = copy.deepcopy(prefix_cache)
            cache.batch_repeat_interleave(len(suffixes))
        logits = self.target.model(
            input_ids=ids.to(device),
            attention_mask=mask.to(device),
            position_ids=positions.to(device),
            cache=cache,
            use_cache=cache is not None,
            logits_to_keep=1,
        ).logits[:, -1, :]
        letters = logits[:, self.letter_ids].float()
        return torch.softmax(letters, dim=-1).cpu().numpy().astype(np.float64)


def build_scorer(target: dict[str, Any], scoring: dict[str, Any]) -> Scorer:
    """Loads the target model (`target` holds load_target's arguments) and wraps it in a scorer."""
    arguments = dict(target)
    model = load_target(arguments.pop("model"), **arguments)
    return Scorer.from_config(model, ScoringConfig(**scoring))


def left_padded(sequences: Sequence[Sequence[int]], pad_id: int,
                prefix_len: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids, attention mask and position ids for a left-padded batch (every prompt ends at the
    last column), optionally continuing a shared prefix of `prefix_len` cached tokens. Positions count
    real tokens only, so padding never shifts a prompt (batched == unbatched)."""
    width = max(len(s) for s in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), prefix_len + width), dtype=torch.long)
    mask[:, :prefix_len] = 1
    for row, seq in enumerate(sequences):
        ids[row, width - len(seq) :] = torch.tensor(seq)
        mask[row, prefix_len + width - len(seq) :] = 1
    positions = (mask.cumsum(-1) - 1).clamp(min=0)[:, prefix_len:]
    return ids, mask, positions


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
