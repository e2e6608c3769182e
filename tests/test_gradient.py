"""White-box proposals on the tiny model: gradients, first-order substitution gains, gradient-guided word
edits and their budget, and the adversarial suffix (token swaps, natural: false, its own split file)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from flexsearch import api
from flexsearch.attacks import AttackResources
from flexsearch.attacks.constraints import editable_positions
from flexsearch.attacks.gradient import (
    GRADIENT_PASS_QUERIES,
    input_embeddings,
    prompt_gradient,
    substitution_gains,
    word_saliency,
)
from flexsearch.attacks.suffix import AdversarialSuffix
from flexsearch.attacks.textbugger import TextBugger
from flexsearch.candidate import Candidate, replay
from flexsearch.config import load_config
from flexsearch.errors import FlexsearchError
from flexsearch.objectives import get_objective
from flexsearch.render import PromptFormat, letter_token_ids
from flexsearch.scoring import Scorer
from flexsearch.search_loop import ItemState, best_first, build_context, item_rng, run_search

FMT = PromptFormat()
CHEAP = ["constraints=[protected_spans, unique_positions, polarity_guard]"]


def goal_at(target, ids: list[int], embeddings: torch.Tensor, candidate: Candidate) -> float:
    """log P(stereotyped answer) over the letters, from given input embeddings (the gradient's goal)."""
    with torch.no_grad():
        logits = target.model(inputs_embeds=embeddings[None], attention_mask=torch.ones(1, len(ids))).logits
        letters = torch.log_softmax(logits[0, -1, letter_token_ids(target.tokenizer, FMT.answer_prefix)].double(), -1)
    return float(letters[candidate.option_order.index(candidate.item.target)])


def one_token_edit(target, root: Candidate, gradient) -> Candidate:
    """A child of `root` that swaps one single-token word for another single-token word."""
    tokenizer = target.tokenizer
    for field_name, index in editable_positions(root):
        if len(gradient.tokens_in(*_span(gradient, field_name, index))) == 1:
            for word in ("dog", "the", "a", "and", "of"):
                single = len(tokenizer.encode(f" {word}", add_special_tokens=False)) == 1
                if single and word != root.words(field_name)[index]:
                    return root.with_words("textbugger", field_name, index, word)
    raise AssertionError("no single-token word to edit in this item")


def _span(gradient, field_name: str, index: int) -> tuple[int, int]:
    from flexsearch.render import word_spans

    return word_spans(gradient.candidate, gradient.prompt)[(field_name, index)]


def test_substitution_gain_is_the_directional_derivative(tiny_target, seed_items):
    """For a one-token swap the estimate g·(e_new − e_old) must equal the goal's derivative along that
    direction, measured by a finite difference on the model itself."""
    objective = get_objective("stereotype")
    for item in seed_items[:3]:
        root = Candidate.root(item)
        gradient = prompt_gradient(tiny_target, FMT, objective, root)
        child = one_token_edit(tiny_target, root, gradient)
        (gain,) = substitution_gains(gradient, tiny_target, [child])
        edit = child.edits[-1]
        (token,) = gradient.tokens_in(*_span(gradient, edit.field, edit.position))
        direction = torch.zeros_like(gradient.embeddings)
        new = input_embeddings(tiny_target, tiny_target.tokenizer.encode(f" {edit.after}", add_special_tokens=False))
        direction[token] = new[0] - gradient.embeddings[token]
        eps = 1e-3
        slope = (goal_at(tiny_target, gradient.ids, gradient.embeddings + eps * direction, root)
                 - goal_at(tiny_target, gradient.ids, gradient.embeddings - eps * direction, root)) / (2 * eps)
        assert abs(slope) > 1e-3  # a flat direction would make the comparison below vacuous
        assert gain == pytest.approx(slope, rel=0.05, abs=1e-4)


def test_word_saliency_covers_every_position(tiny_target, seed_items):
    root = Candidate.root(seed_items[0])
    positions = editable_positions(root)
    scores = word_saliency(prompt_gradient(tiny_target, FMT, get_objective("stereotype"), root), positions)
    assert scores.shape == (len(positions),) and np.isfinite(scores).all() and scores.max() > 0


def test_gradients_are_cached_and_counted(tiny_target, seed_items):
    resources = AttackResources(target=tiny_target, objective=get_objective("stereotype"))
    root = Candidate.root(seed_items[0])
    first = resources.gradient(root)
    assert resources.gradient(root) is first and resources.gradient_passes == 1
    resources.gradient(root.with_slot("persona", "persona", "Be brief."))
    assert resources.gradient_passes == 2


def _context(tiny_target, *overrides: str):
    config = load_config("gradient", [*CHEAP, *overrides])
    return build_context(config, Scorer(tiny_target, batch_size=8), "stereotype")


def test_best_first_keeps_the_highest_gains_and_charges_one_pass(tiny_target, seed_items):
    ctx = _context(tiny_target, "gradient_top=3")
    item = seed_items[1]
    state = ItemState(item, ctx.objective, item_rng(0, item.id, "stereotype"), 100, 3)
    root = Candidate.root(item)
    bugger = TextBugger(AttackResources(), bugs=["insert", "delete", "swap", "sub_c"], per_position=4)
    edits = bugger.propose(root, np.random.default_rng(0), editable_positions(root))
    kept = best_first(ctx, state, root, edits)
    assert state.queries == GRADIENT_PASS_QUERIES and len(kept) == 3
    gains = substitution_gains(ctx.resources.gradient(root), tiny_target, edits)
    expected = [edits[i] for i in np.argsort(-gains, kind="stable")[:3]]
    assert kept == expected and state.queries == GRADIENT_PASS_QUERIES  # the second gradient came from the cache


def test_gradient_guided_search_stays_within_budget(tiny_target, seed_items):
    ctx = _context(tiny_target, "budget=30", "control=false")
    outcomes = run_search(seed_items[:6], ctx, "stereotype")
    assert ctx.resources.gradient_passes >= 6
    assert all(o.queries <= 30 for o in outcomes)
    assert any(e.operator == "textbugger" for o in outcomes for e in o.best.edits)


def test_gradient_proposals_refuse_evolutionary_and_unknown_values():
    with pytest.raises(FlexsearchError, match="proposals"):
        load_config("gradient", ["method=evolutionary"])
    with pytest.raises(FlexsearchError, match="expected one of sampled, gradient"):
        load_config("default", ["proposals=smart"])


def test_adversarial_suffix_swaps_one_token_of_a_fixed_slot(tiny_target, seed_items):
    resources = AttackResources(target=tiny_target, objective=get_objective("stereotype"))
    operator = AdversarialSuffix(resources, length=6, top_k=8, swaps=5)
    root = Candidate.root(seed_items[0])
    proposals = operator.propose(root, np.random.default_rng(0))
    assert 1 <= len(proposals) <= 5 and resources.gradient_passes == 1
    width = len(tiny_target.tokenizer.encode(operator.initial, add_special_tokens=False))
    for child in proposals:
        assert not child.natural and child.suffix and child.suffix.isascii() and "\n" not in child.suffix
        assert len(tiny_target.tokenizer.encode(child.suffix, add_special_tokens=False)) == width
        assert replay(child.item, child.chain()) == child
    second = operator.propose(proposals[0], np.random.default_rng(1))
    assert all(c.suffix != proposals[0].suffix and len(c.edits) == 2 for c in second)


def test_suffix_search_raises_the_objective(tiny_target, seed_items):
    """GCG's loop (beam width 1, suffix swaps only) must find a suffix that beats the clean prompt."""
    config = load_config("research", [*CHEAP, "operators=[{name: adversarial_suffix, length: 6, top_k: 16, swaps: 6}]",
                                      "beam_width=1", "steps=6", "budget=200", "stop_on_success=false"])
    ctx = build_context(config, Scorer(tiny_target, batch_size=8), "stereotype")
    outcomes = run_search(seed_items[:2], ctx, "stereotype")
    for outcome in outcomes:
        assert outcome.best.suffix and not outcome.best.natural
        value = ctx.objective.value
        assert value(outcome.best_probs, outcome.item) > value(outcome.clean_probs, outcome.item)


def test_research_rows_are_kept_out_of_the_split(tiny_model_dir, tmp_path):
    result = api.search("seed", model=str(tiny_model_dir), out=tmp_path / "r", config="research", limit=4,
                        overrides=[*CHEAP, "budget=60", "operators=[{name: adversarial_suffix, length: 4, top_k: 8, "
                                                            "swaps: 4}]"])
    natural = [json.loads(line) for line in (tmp_path / "r" / "split.jsonl").read_text().splitlines()]
    research = [json.loads(line) for line in (tmp_path / "r" / "split-research.jsonl").read_text().splitlines()]
    assert research and all(not r["natural"] for r in research) and all(r["natural"] for r in natural)
    assert len(natural) + len(research) == 4 == len(result.rows)
    assert result.score.data["split_rows"] == {"natural": len(natural), "research": len(research)}
    assert "split-research.jsonl" in (tmp_path / "r" / "README.md").read_text()
