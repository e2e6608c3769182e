"""Word importance for greedy attacks: leave-one-out probes (black-box) and gradient saliency (white-box)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from flexsearch.attacks.base import Position
from flexsearch.candidate import Candidate
from flexsearch.model import TargetModel
from flexsearch.objectives import Objective
from flexsearch.render import PromptFormat, render, word_spans


def leave_one_out_probes(candidate: Candidate, positions: Sequence[Position]) -> list[Candidate]:
    """One probe per position with that word deleted; score them, then call `importance_from_probes`."""
    return [candidate.with_words("leave_one_out", f, i, "") for f, i in positions]


def importance_from_probes(base_value: float, probe_values: Sequence[float] | np.ndarray) -> np.ndarray:
    """How much deleting each word moves the objective toward the attacker (higher = more important)."""
    return np.asarray(probe_values, dtype=float) - base_value


def gradient_importance(target: TargetModel, fmt: PromptFormat, objective: Objective,
                        candidate: Candidate, positions: Sequence[Position]) -> np.ndarray:
    """|gradient · embedding| of the objective w.r.t. each word's input embeddings (one forward+backward)."""
    from flexsearch.scoring import letter_token_ids

    tokenizer, model = target.tokenizer, target.model
    prompt = render(candidate, tokenizer, fmt)
    encoded = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=fmt.mode == "plain",
                        return_tensors="pt")
    offsets = encoded.pop("offset_mapping")[0].tolist()
    embeddings = model.get_input_embeddings()(encoded["input_ids"].to(target.device)).detach()
    embeddings.requires_grad_(True)
    with torch.enable_grad():
        logits = model(inputs_embeds=embeddings, attention_mask=encoded["attention_mask"].to(target.device)).logits
        letters = torch.log_softmax(logits[0, -1, letter_token_ids(tokenizer, fmt.answer_prefix)].float(), -1)
        answer_log_probs = letters[[candidate.option_order.index(a) for a in range(3)]]
        aim = objective.target_answer(candidate.item)
        # Targeted: raise log P(target); untargeted: lower log P(gold).
        goal = answer_log_probs[aim] if aim is not None else -answer_log_probs[candidate.item.gold]
        goal.backward()
    saliency = (embeddings.grad[0] * embeddings[0]).sum(-1).abs().detach().float().cpu().numpy()
    spans = word_spans(candidate, prompt)
    scores = []
    for position in positions:
        start, end = spans[position]
        tokens = [t for t, (a, b) in enumerate(offsets) if a < end and b > start]
        scores.append(float(saliency[tokens].sum()) if tokens else 0.0)
    return np.asarray(scores)
