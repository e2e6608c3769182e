"""The white-box backend: a causal LM loaded by transformers in this process (DESIGN.md "Scoring"). Each rendered
prompt gets one forward pass; the next-token distribution at the answer position, restricted to the three
option-letter tokens and renormalised, is P(A), P(B), P(C). Prompts that share a long token prefix (an instruction
template, a context) compute that prefix's key/value cache once and score only their suffixes; the batch is halved
on out-of-memory. torch is imported where a model runs, not with this module."""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

from flexsearch.config import ScoringConfig
from flexsearch.data.candidate import Candidate
from flexsearch.data.render import PromptFormat, format_facts, letter_token_ids, render
from flexsearch.errors import FlexsearchError
from flexsearch.scoring.backends.base import BACKENDS, IN_PROCESS
from flexsearch.scoring.model import TargetModel, load_target

if TYPE_CHECKING:
    import torch


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


@BACKENDS.register(IN_PROCESS)
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
    def connect(cls, target: dict[str, Any], scoring: ScoringConfig) -> InProcessBackend:
        """Loads the model `target` names (any causal LM: hub id, directory, .gguf, alias) with its load options."""
        options = {k: v for k, v in target.items() if k in LOAD_ARGUMENTS}
        return cls.from_config(load_target(target["model"], **options), scoring)

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
