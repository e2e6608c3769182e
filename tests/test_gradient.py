"""White-box proposals on the tiny model: gradients, first-order substitution gains, gradient-guided word
edits and their budget, and the adversarial suffix (token swaps, natural: false, its own split file)."""

from __future__ import annotations

import json
from dataclasses import replace

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
from flexsearch.config import load_config
from flexsearch.data.candidate import Candidate, replay
from flexsearch.data.render import PromptFormat, cyclic_orders, letter_token_ids, render
from flexsearch.engine.loop import build_context, run_search
from flexsearch.engine.state import ItemState, best_first, expansion_phases, item_rng
from flexsearch.errors import FlexsearchError
from flexsearch.objectives import get_objective
from flexsearch.scoring.scorer import Scorer

FMT = PromptFormat()
CHEAP = ["constraints=[protected_spans, unique_positions, polarity_guard]"]


def goal_at(target, candidate: Candidate, orders, token: int, shift: torch.Tensor) -> float:
    """The stereotype objective's value on the order-averaged letters, with `shift` added to the input
    embedding of prompt token `token` in every order's prompt (computed independently of attacks/)."""
    tokenizer, probs = target.tokenizer, np.zeros(3)
    for order in orders:
        shown = replace(candidate, option_order=order)
        ids = tokenizer(render(shown, tokenizer, FMT), return_tensors="pt")["input_ids"]
        with torch.no_grad():
            embeddings = target.model.get_input_embeddings()(ids)[0].double()
            embeddings[token] += shift.double()
            logits = target.model.double()(inputs_embeds=embeddings[None]).logits
            target.model.float()
            letters = torch.softmax(logits[0, -1, letter_token_ids(tokenizer, FMT.answer_prefix)], -1).numpy()
        for slot, answer in enumerate(order):
            probs[answer] += letters[slot] / len(orders)
    return get_objective("stereotype").value(probs, candidate.item)


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
    from flexsearch.data.render import word_spans

    return word_spans(gradient.candidate, gradient.prompt)[(field_name, index)]


@pytest.mark.parametrize("averaged", [False, True], ids=["displayed order", "three orders"])
def test_substitution_gain_is_the_directional_derivative(tiny_target, seed_items, averaged):
    """For a one-token swap the estimate g·(e_new − e_old) must equal the objective's derivative along that
    direction, measured by a finite difference on the model itself (over every averaged order)."""
    objective = get_objective("stereotype")
    for item in seed_items[:3]:
        root = Candidate.root(item)
        orders = cyclic_orders(root.option_order) if averaged else [root.option_order]
        gradient = prompt_gradient(tiny_target, FMT, objective, root, orders)
        child = one_token_edit(tiny_target, root, gradient)
        (gain,) = substitution_gains(gradient, tiny_target, [child])
        edit = child.edits[-1]
        (token,) = gradient.tokens_in(*_span(gradient, edit.field, edit.position))
        new = input_embeddings(tiny_target, tiny_target.tokenizer.encode(f" {edit.after}", add_special_tokens=False))
        direction = new[0] - gradient.embeddings[token]
        eps = 1e-4
        slope = (goal_at(tiny_target, root, orders, token, eps * direction)
                 - goal_at(tiny_target, root, orders, token, -eps * direction)) / (2 * eps)
        assert abs(slope) > 1e-3  # a flat direction would make the comparison below vacuous
        assert gain == pytest.approx(slope, rel=0.05, abs=1e-4)


def test_a_gradient_over_three_orders_covers_the_prompt_they_share(tiny_target, seed_items):
    root = Candidate.root(seed_items[0])
    gradient = prompt_gradient(tiny_target, FMT, get_objective("stereotype"), root, cyclic_orders(root.option_order))
    covered = gradient.offsets[-1][1]
    prompts = [render(replace(root, option_order=o), tiny_target.tokenizer, FMT)
               for o in cyclic_orders(root.option_order)]
    assert len({p[:covered] for p in prompts}) == 1  # what it covers, every order's prompt shares ...
    assert covered < len(prompts[0]) and len({p[: covered + 12] for p in prompts}) > 1  # ... and no more
    positions = editable_positions(root)
    assert all(gradient.tokens_in(*_span(gradient, *p)) for p in positions)  # every editable word is


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
    return build_context(config, Scorer.in_process(tiny_target, batch_size=8), "stereotype")


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
    ctx = _context(tiny_target, "budget=30", "control=false", "stop_on_success=false")
    outcomes = run_search(seed_items[:6], ctx, "stereotype")
    assert ctx.resources.gradient_passes >= 6
    assert all(o.queries <= 30 for o in outcomes)
    assert any(e.operator == "textbugger" for o in outcomes for e in o.best.edits)


def test_guided_expansion_pays_its_gradient_only_after_the_templates_are_scored(tiny_target, seed_items):
    ctx = _context(tiny_target)
    item = seed_items[2]
    state = ItemState(item, ctx.objective, item_rng(0, item.id, "stereotype"), 100, 1)
    parents = [Candidate.root(item)]
    templates, word_edits = expansion_phases(ctx, state, parents)
    assert all(c.edits[-1].position is None for c in templates()) and state.queries == 0
    edits = word_edits()
    assert edits and all(c.edits[-1].operator == "textbugger" for c in edits)
    assert state.queries == GRADIENT_PASS_QUERIES and ctx.resources.gradient_passes == 1


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
    ctx = build_context(config, Scorer.in_process(tiny_target, batch_size=8), "stereotype")
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
    # a suffix alone is in no attack family, so the family split is empty
    assert result.score.data["split_rows"] == {"benchmark": len(natural), "forced_choice": 0, "research": len(research),
                                               "families": 0}
    assert "split-research.jsonl" in (tmp_path / "r" / "README.md").read_text()
