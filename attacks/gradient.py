"""First-order views of the objective for white-box proposals: word saliency (which words matter), the
estimated gain of a word substitution (which replacement to score), and token swaps for the adversarial
suffix. All three read one forward+backward pass over a candidate's prompt (`PromptGradient`).

The goal is the search's own objective value (the log-margin log P(aim) − log max P(other), or
−log P(gold) when untargeted) on the letter distribution of the prompt in its displayed option order, or
averaged over several orders when `prompt_gradient` is given them.

Budget: a backward pass costs about two forward passes, so one forward+backward over one prompt is
charged as GRADIENT_PASS_QUERIES prompts of the item's query budget (DESIGN.md "Search methods and
proposals").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from flexsearch.data.candidate import Candidate
from flexsearch.data.render import PromptFormat, common_prefix_length, letter_token_ids, render, word_spans
from flexsearch.objectives import Objective

if TYPE_CHECKING:  # torch is imported where it runs: commands that load no model must not pay for it
    import torch

    from flexsearch.scoring.model import TargetModel

GRADIENT_PASS_QUERIES = 3
Order = tuple[int, int, int]


@dataclass
class PromptGradient:
    """The objective's gradient with respect to a prompt's input embeddings (as the model sees them).
    With several option orders it covers the tokens every order's prompt shares (instruction slots,
    context, question: everything before the options), summed over the orders."""

    candidate: Candidate
    prompt: str  # in the candidate's displayed order
    ids: list[int]
    offsets: list[tuple[int, int]]  # character span of every covered token in `prompt`
    embeddings: torch.Tensor  # (tokens, dim)
    grad: torch.Tensor  # (tokens, dim): d goal / d embeddings

    def tokens_in(self, start: int, end: int) -> list[int]:
        """Covered token positions that overlap the character span [start, end)."""
        return [t for t, (a, b) in enumerate(self.offsets) if a < end and b > start]


def input_embeddings(target: TargetModel, ids: Sequence[int]) -> torch.Tensor:
    """Input embeddings of token ids, including any scaling the embedding layer applies (Gemma's)."""
    import torch

    with torch.no_grad():
        return target.model.get_input_embeddings()(torch.tensor([list(ids)], device=target.device))[0].float()


def objective_goal(objective: Objective, candidate: Candidate, answer_probs: torch.Tensor) -> torch.Tensor:
    """The objective's value (objectives/__init__.py) on P(answer), differentiably."""
    import torch

    aim = objective.target_answer(candidate.item)
    if aim is None:
        return -torch.log(answer_probs[candidate.item.gold])
    others = torch.stack([answer_probs[k] for k in range(3) if k != aim])
    return torch.log(answer_probs[aim]) - torch.log(others.max())


def prompt_gradient(target: TargetModel, fmt: PromptFormat, objective: Objective, candidate: Candidate,
                    orders: Sequence[Order] | None = None) -> PromptGradient:
    """One forward+backward over the candidate's prompt in each option order (default: the displayed one;
    the first order given must be the displayed one), toward the objective on the order-averaged answer
    distribution."""
    import torch

    tokenizer, model = target.tokenizer, target.model
    orders = list(orders or [candidate.option_order])
    assert orders[0] == candidate.option_order, "the first order is the displayed one"
    letter_ids = letter_token_ids(tokenizer, fmt.answer_prefix)
    prompts, encodings, leaves = [], [], []
    answer_probs = torch.zeros(3, dtype=torch.float32, device=target.device)
    with torch.enable_grad():
        for order in orders:
            prompt = render(replace(candidate, option_order=order), tokenizer, fmt)
            encoded = tokenizer(prompt, return_offsets_mapping=True, add_special_tokens=fmt.mode == "plain",
                                return_tensors="pt")
            embeddings = model.get_input_embeddings()(encoded["input_ids"].to(target.device)).detach()
            embeddings.requires_grad_(True)
            logits = model(inputs_embeds=embeddings, attention_mask=encoded["attention_mask"].to(target.device),
                           logits_to_keep=1).logits
            letters = torch.softmax(logits[0, -1, letter_ids].float(), -1)
            answer_probs = answer_probs + letters[[order.index(a) for a in range(3)]] / len(orders)
            prompts.append(prompt)
            encodings.append(encoded)
            leaves.append(embeddings)
        objective_goal(objective, candidate, answer_probs).backward()
    ids = [e["input_ids"][0].tolist() for e in encodings]
    shared = common_prefix_length(ids)
    grad = sum(leaf.grad[0, :shared].float() for leaf in leaves if leaf.grad is not None)
    assert isinstance(grad, torch.Tensor)
    offsets = [tuple(span) for span in encodings[0]["offset_mapping"][0, :shared].tolist()]
    return PromptGradient(candidate, prompts[0], ids[0][:shared], offsets, leaves[0][0, :shared].detach().float(),
                          grad)


def word_saliency(gradient: PromptGradient, positions: Sequence[tuple[str, int]]) -> np.ndarray:
    """|gradient · embedding| summed over each word's tokens (higher = the word matters more)."""
    saliency = (gradient.grad * gradient.embeddings).sum(-1).abs().cpu().numpy()
    spans = word_spans(gradient.candidate, gradient.prompt)
    return np.asarray([float(saliency[gradient.tokens_in(*spans[p])].sum()) for p in positions])


def substitution_gains(gradient: PromptGradient, target: TargetModel,
                       children: Sequence[Candidate]) -> np.ndarray:
    """The first-order change of the goal for each child, a one-word substitution of the gradient's
    candidate: Σ over the old word's tokens t of g_t · (ē_new − e_t), with ē_new the mean embedding of
    the new word's tokens (the words may differ in token count, so the new word is spread evenly)."""
    spans = word_spans(gradient.candidate, gradient.prompt)
    gains = []
    for child in children:
        edit = child.edits[-1]
        assert edit.position is not None, "substitution_gains scores word edits only"
        tokens = gradient.tokens_in(*spans[(edit.field, edit.position)])
        new_ids = target.tokenizer.encode(f" {edit.after}", add_special_tokens=False)
        if not tokens or not new_ids:
            gains.append(0.0)
            continue
        new = input_embeddings(target, new_ids).mean(0)
        gains.append(float((gradient.grad[tokens] * (new - gradient.embeddings[tokens])).sum()))
    return np.asarray(gains)


def token_swap_scores(gradient: PromptGradient, target: TargetModel, tokens: Sequence[int]) -> torch.Tensor:
    """(len(tokens), vocabulary): the linearised gain of putting each vocabulary token at each of the
    given positions (GCG's one-hot gradient), up to a per-position constant."""
    import torch

    layer = target.model.get_input_embeddings()
    scale = float(getattr(layer, "embed_scale", 1.0))
    with torch.no_grad():
        return (gradient.grad[list(tokens)] @ embedding_matrix(target).float().T) * scale


def embedding_matrix(target: TargetModel) -> torch.Tensor:
    """The input embedding table (vocabulary rows; before any scaling the layer applies)."""
    import torch

    weight = target.model.get_input_embeddings().weight
    assert isinstance(weight, torch.Tensor)
    return weight
