"""BERT-Attack (Li et al., 2020): substitutes proposed by a masked language model in context."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from flexsearch.attacks.base import OPERATORS, AttackResources
from flexsearch.attacks.textbugger import match_case, split_word
from flexsearch.attacks.word import WordOperator
from flexsearch.errors import FlexsearchError

NEEDS = ("needs a fill-mask model: a local folder, or a hub id that is cached or reachable; pass one with "
         "--set 'operators=[{name: bert_attack, model: PATH}]'")


def masked_lm_problem(name: str) -> str | None:
    """Why the masked LM cannot be loaded here (not local, not cached, hub unreachable), or None."""
    from flexsearch.scoring.model import check_model_source

    try:
        check_model_source(name, None)
    except FlexsearchError as err:
        return f"'{name}' cannot be loaded ({str(err).split(': ', 1)[-1]}); bert_attack {NEEDS}"
    return None


@lru_cache(maxsize=2)
def load_masked_lm(name: str):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    problem = masked_lm_problem(name)
    if problem:
        raise FlexsearchError(f"bert_attack: {problem}")

    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForMaskedLM.from_pretrained(name).eval()
    except OSError as err:
        raise FlexsearchError(f"bert_attack: cannot load masked LM '{name}': {err}") from None
    if tokenizer.mask_token is None:
        raise FlexsearchError(f"bert_attack: '{name}' has no mask token")
    return tokenizer, model


@OPERATORS.register("bert_attack")
class BertAttack(WordOperator):
    """Masked-LM substitutes (any Hugging Face fill-mask model), sub-word words handled piece by piece."""

    @staticmethod
    def availability_problem(model: str = "bert-base-uncased", **_: object) -> str | None:
        """Why this operator cannot run on this machine (checked before the target model loads), or None."""
        return masked_lm_problem(model)

    def __init__(self, resources: AttackResources, model: str = "bert-base-uncased", k: int = 8,
                 positions: int = 2, per_position: int = 4, max_pieces: int = 3) -> None:
        self.tokenizer, self.model = load_masked_lm(model)
        self.k, self.positions, self.per_position, self.max_pieces = k, positions, per_position, max_pieces

    def _piece_text(self, token_id: int) -> str:
        return self.tokenizer.convert_ids_to_tokens(token_id)

    def substitutes(self, words: Sequence[str], index: int) -> list[str]:
        """Top substitutes for words[index]: it is masked with one mask per sub-word piece, each piece's
        top-k are combined and ranked by their summed log-probability (BERT-Attack's sub-word rule)."""
        import torch

        lead, word, trail = split_word(words[index])
        pieces = self.tokenizer.tokenize(word)
        if not word.isalpha() or not pieces or len(pieces) > self.max_pieces:
            return []
        masked = [*words[:index], f"{lead}{' '.join([self.tokenizer.mask_token] * len(pieces))}{trail}",
                  *words[index + 1:]]
        encoded = self.tokenizer(" ".join(masked), return_tensors="pt", truncation=True)
        slots = (encoded["input_ids"][0] == self.tokenizer.mask_token_id).nonzero().flatten()
        if len(slots) != len(pieces):  # the mask fell outside the model's window
            return []
        with torch.inference_mode():
            log_probs = torch.log_softmax(self.model(**encoded).logits[0, slots], dim=-1)
        top = torch.topk(log_probs, self.k, dim=-1)
        ranked = []
        for combo in itertools.product(range(self.k), repeat=len(pieces)):
            score = sum(float(top.values[p, c]) for p, c in enumerate(combo))
            text = "".join(self._piece_text(int(top.indices[p, c])) for p, c in enumerate(combo))
            ranked.append((score, text))
        seen, out = {word.lower()}, []
        for _, text in sorted(ranked, reverse=True):
            if text.startswith("##"):  # a continuation piece cannot start a word
                continue
            candidate = text.replace("##", "")
            if candidate.isalpha() and candidate.lower() not in seen:
                seen.add(candidate.lower())
                out.append(match_case(word, candidate))
            if len(out) >= self.k:
                break
        return out

    def replacements(self, words: Sequence[str], index: int,
                     rng: np.random.Generator) -> list[tuple[str, dict[str, Any]]]:
        lead, _, trail = split_word(words[index])
        return [(f"{lead}{substitute}{trail}", {}) for substitute in self.substitutes(words, index)]
