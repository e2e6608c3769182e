"""The adversarial suffix, a token-level research family in the style of GCG (Zou et al., 2023): a free
slot of k tokens after the instruction, changed one token at a time toward the objective. Each proposal
round takes one gradient pass on the parent's prompt, ranks every vocabulary token at every slot position
by the one-hot gradient, and proposes `swaps` single-token swaps drawn from each position's `top_k`; the
search scores them and keeps the best (beam width 1 is GCG's greedy coordinate step). Its prompts are not
natural text: their rows say `natural: false` and never mix with the natural split (DESIGN.md
"Adversarial suffix").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from flexsearch.attacks.base import OPERATORS, AttackResources, Position, refuse_settings
from flexsearch.data.candidate import Candidate
from flexsearch.errors import FlexsearchError

if TYPE_CHECKING:  # torch is imported where the suffix is optimised, not when the operator registers
    import torch
    from transformers import PreTrainedTokenizerBase

_PRINTABLE: dict[tuple[str, int, int], torch.Tensor] = {}


def printable_tokens(tokenizer: PreTrainedTokenizerBase, vocabulary: int) -> torch.Tensor:
    """A mask over the embedding rows: tokens that decode to printable one-line ASCII and are not
    special (GCG's usual restriction; it keeps the slot text writable into a CSV cell and a prompt).
    Computed once per tokenizer (decoding a 262k vocabulary takes seconds)."""
    import torch

    key = (tokenizer.name_or_path, len(tokenizer), vocabulary)
    if key not in _PRINTABLE:
        special = set(tokenizer.all_special_ids)
        texts = tokenizer.batch_decode([[i] for i in range(min(vocabulary, len(tokenizer)))])
        mask = torch.zeros(vocabulary, dtype=torch.bool)
        mask[: len(texts)] = torch.tensor([i not in special and bool(t.strip()) and t.isascii() and t.isprintable()
                                           for i, t in enumerate(texts)])
        _PRINTABLE[key] = mask
    return _PRINTABLE[key]


@OPERATORS.register("adversarial_suffix")
class AdversarialSuffix:
    """k optimised tokens after the instruction; single-token swaps ranked by the one-hot gradient."""

    name: ClassVar[str] = "adversarial_suffix"
    edits_words: ClassVar[bool] = False
    needs_gradient: ClassVar[bool] = True

    def __init__(self, resources: AttackResources, length: int = 8, top_k: int = 32, swaps: int = 8,
                 init: str = "!") -> None:
        if resources.target is None:
            raise FlexsearchError("adversarial_suffix needs a white-box target model")
        refuse_settings(self.name, self.settings_problem(length=length, top_k=top_k, swaps=swaps))
        self.resources, self.top_k, self.swaps = resources, top_k, swaps
        self.initial = " ".join([init] * length)

    @staticmethod
    def settings_problem(length: int = 8, top_k: int = 32, swaps: int = 8, **_: object) -> str | None:
        """Why these settings cannot work, or None (checked with the config, before any model loads)."""
        if min(length, top_k, swaps) < 1:
            return f"length, top_k and swaps must be at least 1, got {length}, {top_k}, {swaps}"
        return None

    def propose(self, candidate: Candidate, rng: np.random.Generator,
                positions: Sequence[Position] | None = None) -> list[Candidate]:
        import torch

        from flexsearch.attacks.gradient import token_swap_scores

        target = self.resources.target
        assert target is not None
        current = candidate.suffix or self.initial
        # The first round starts from the initial slot text; the proposals' edits replace "" directly.
        seeded = replace(candidate, suffix=current)
        gradient = self.resources.gradient(seeded)
        start = gradient.prompt.find(seeded.instruction) + len(seeded.instruction) - len(current)
        tokens = gradient.tokens_in(start, start + len(current))
        if not tokens:
            return []
        scores = token_swap_scores(gradient, target, tokens)
        scores[:, ~printable_tokens(target.tokenizer, scores.shape[1]).to(scores.device)] = -torch.inf
        best = scores.topk(min(self.top_k, scores.shape[1]), dim=1).indices.cpu().numpy()
        ids = [gradient.ids[t] for t in tokens]
        width = len(target.tokenizer.encode(current, add_special_tokens=False))
        out: list[Candidate] = []
        seen = {current}
        for _ in range(4 * self.swaps):  # some swaps decode to a slot already seen or of another length
            if len(out) == self.swaps:
                break
            slot = int(rng.integers(len(ids)))
            swapped = [*ids[:slot], int(best[slot, rng.integers(best.shape[1])]), *ids[slot + 1:]]
            text = str(target.tokenizer.decode(swapped)).strip()
            if text in seen or len(target.tokenizer.encode(text, add_special_tokens=False)) != width:
                continue
            seen.add(text)
            out.append(candidate.with_slot(self.name, "suffix", text))
        return out
