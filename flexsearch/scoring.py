"""Answer scoring (DESIGN.md "Scoring", "Scoring backends"): a Scorer over a backend.

The Scorer renders candidates, averages option orders and caches prompts; its backend scores prompts. In
process, each rendered prompt gets one forward pass; the next-token distribution at the answer position,
restricted to the three option-letter tokens and renormalised, is mapped back through the option
order to P(answer). Prompts are deduplicated by a cache keyed by the rendered text; prompts that
share a long token prefix (an instruction template, a context) compute that prefix's key/value
cache once and score only their suffixes. torch is imported where a model runs, not with this module.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from flexsearch.candidate import Candidate
from flexsearch.config import ScoringConfig, prompts_per_candidate
from flexsearch.errors import FlexsearchError
from flexsearch.items import Item
from flexsearch.model import TargetModel, load_target
from flexsearch.render import PromptFormat, cyclic_orders, format_facts, letter_token_ids, render

if TYPE_CHECKING:
    import torch


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


class ScoringBackend(Protocol):
    """Where rendered prompts are scored: P(A), P(B), P(C) per prompt, and what it cost (DESIGN.md "Scoring
    backends"). In process (`InProcessBackend`, white-box) or behind an OpenAI-compatible server
    (`flexsearch.served.ServedBackend`, black-box); the search loop and every command hold a `Scorer` over one
    and never ask which."""

    fmt: PromptFormat
    info: dict[str, Any]  # provenance: recorded in config.yaml and score.json

    @property
    def white_box(self) -> TargetModel | None:
        """The loaded model (gradients, embeddings, fine-tuning); None when served."""
        ...

    queries_per_prompt: int  # what one prompt costs the budget (samples per prompt in sample mode)
    max_prompt_tokens: int  # longer prompts are skipped (a served model's context is the server's to enforce)

    def render(self, candidate: Candidate) -> str: ...

    def prompt_tokens(self, prompt: str) -> int | None:
        """The prompt's length in the target's tokens; None when only the server knows it."""
        ...

    def letter_probs(self, prompts: Sequence[str]) -> np.ndarray:
        """(N, 3): P(A), P(B), P(C) for each prompt (letters in displayed order); no caching."""
        ...

    def usage(self) -> dict[str, Any]:
        """What scoring cost beyond prompts (requests, tokens, retries, cache hits); empty in process."""
        ...

    def progress(self) -> dict[str, str]:
        """Fields for the progress bar (requests/s, retries); empty in process."""
        ...

    def take_usage(self) -> dict[str, Any]:
        """The raw cost counters gathered since the last call, then reset (a Ray worker reports its share)."""
        ...

    def merge_usage(self, counters: dict[str, Any]) -> None:
        """Adds another process's take_usage() to this backend's cost."""
        ...


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


class InProcessBackend:
    """The white-box backend: a loaded causal LM, one forward pass per prompt, prompts sharing a long token
    prefix computing that prefix's key/value cache once, the batch halved on out-of-memory."""

    queries_per_prompt = 1

    def __init__(
        self,
        target: TargetModel,
        fmt: PromptFormat | None = None,
        *,
        batch_size: int = 16,
        prefix_reuse: bool = True,
        min_shared_prefix: int = 16,
        min_prefix_saving: float = 0.5,
        max_prompt_tokens: int = 0,
    ) -> None:
        self.target = target
        self.fmt = fmt or PromptFormat()
        model = str(target.info.get("model", "this model"))
        facts = format_facts(self.fmt, target.tokenizer, model)  # refuses a system slot the template lacks
        self.info = {**target.info, "prompt_format": facts}
        self.batch_size = batch_size
        self.prefix_reuse = prefix_reuse
        self.min_shared_prefix = min_shared_prefix
        self.min_prefix_saving = min_prefix_saving
        self.letter_ids = letter_token_ids(target.tokenizer, self.fmt.answer_prefix)
        self._prefix_tail = target.tokenizer.encode(self.fmt.answer_prefix, add_special_tokens=False)[-1]
        context = getattr(target.model.config, "max_position_embeddings", None) or 1 << 30
        self.max_prompt_tokens = min(context, max_prompt_tokens) if max_prompt_tokens > 0 else context

    @classmethod
    def from_config(cls, target: TargetModel, scoring: ScoringConfig) -> InProcessBackend:
        return cls(target, PromptFormat(mode=scoring.mode, slot=scoring.slot), batch_size=scoring.batch_size,
                   prefix_reuse=scoring.prefix_reuse, max_prompt_tokens=scoring.max_prompt_tokens)

    @property
    def white_box(self) -> TargetModel:
        return self.target

    def render(self, candidate: Candidate) -> str:
        return render(candidate, self.target.tokenizer, self.fmt)

    def _encode(self, prompt: str) -> list[int]:
        add_special = self.fmt.mode == "plain"  # a chat template already holds its special tokens
        return self.target.tokenizer.encode(prompt, add_special_tokens=add_special)

    def prompt_tokens(self, prompt: str) -> int:
        return len(self._encode(prompt))

    def usage(self) -> dict[str, Any]:
        return {}

    def progress(self) -> dict[str, str]:
        return {}

    def take_usage(self) -> dict[str, Any]:
        return {}

    def merge_usage(self, counters: dict[str, Any]) -> None:
        pass

    def letter_probs(self, prompts: Sequence[str]) -> np.ndarray:
        sequences = [self._encode(p) for p in prompts]
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
        return result

    def _prefix_cache(self, prefix: list[int]):
        import torch

        with torch.inference_mode():
            ids = torch.tensor([prefix], device=self.target.device)
            return self.target.model(input_ids=ids, use_cache=True, logits_to_keep=1).cache

    def _run_batches(self, prefix_cache, prefix_len: int, suffixes: list[list[int]]) -> np.ndarray:
        """Scores suffixes in batches, halving the batch size on out-of-memory."""
        import torch

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

    def _run(self, prefix_cache, prefix_len: int, suffixes: list[list[int]]) -> np.ndarray:
        import torch

        device = self.target.device
        ids, mask, positions = left_padded(suffixes, self.target.tokenizer.pad_token_id, prefix_len)
        with torch.inference_mode():  # the cache copy too, as before: the prefix's tensors are inference tensors
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
                logits_to_keep=last_position(ids),
            ).logits[:, -1, :]
            letters = logits[:, self.letter_ids].float()
            return torch.softmax(letters, dim=-1).cpu().numpy().astype(np.float64)


def last_position(ids: torch.Tensor) -> torch.Tensor:
    """The last position as an index tensor for `logits_to_keep`: the model then gathers the last hidden state
    as a contiguous copy. `logits_to_keep=1` slices a strided view instead, and on CPU a bfloat16 output layer
    fed a strided batch broadcasts its weight to one copy per prompt (262,144 x 640 x 2 bytes = 335 MB each on
    Gemma-3, measured with torch.profiler), the transient that grew with the batch."""
    import torch

    return torch.tensor([ids.shape[1] - 1], device=ids.device)


def build_scorer(target: dict[str, Any], scoring: dict[str, Any]) -> Scorer:
    """The scorer a command asks for: `target` holds the model spec and its options (api.Target.arguments:
    a served model's when it names one, load_target's otherwise), `scoring` a ScoringConfig's fields."""
    config = ScoringConfig(**scoring)
    return Scorer(build_backend(target, config), average_orders=config.average_orders)


def build_backend(target: dict[str, Any], scoring: ScoringConfig) -> ScoringBackend:
    """Connects to the served model `target` names, or loads it in process."""
    from flexsearch.served import ServedBackend, is_served

    arguments = {k: v for k, v in target.items() if v is not None}
    if is_served(arguments["model"]):
        return ServedBackend.connect(arguments, scoring)
    model = load_target(arguments.pop("model"), **{k: v for k, v in arguments.items() if k in LOAD_ARGUMENTS})
    return InProcessBackend.from_config(model, scoring)


LOAD_ARGUMENTS = ("gguf_file", "adapter", "device", "dtype", "revision", "trust_remote_code")


def left_padded(sequences: Sequence[Sequence[int]], pad_id: int,
                prefix_len: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Input ids, attention mask and position ids for a left-padded batch (every prompt ends at the
    last column), optionally continuing a shared prefix of `prefix_len` cached tokens. Positions count
    real tokens only, so padding never shifts a prompt (batched == unbatched)."""
    import torch

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
