"""One-pass scoring: batching, the restricted softmax, option orders, prefix reuse, OOM halving."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import torch

from flexsearch.data.candidate import Candidate
from flexsearch.data.render import PromptFormat, chat_template_facts, letter_token_ids, render
from flexsearch.errors import FlexsearchError
from flexsearch.scoring.backends.in_process import InProcessBackend, shared_prefix_groups
from flexsearch.scoring.scorer import Scorer


def roots(items, n=8):
    return [Candidate.root(it) for it in items[:n]]


def test_batched_equals_unbatched(tiny_target, seed_items):
    candidates = roots(seed_items, 10)
    one = Scorer.in_process(tiny_target, batch_size=1, prefix_reuse=False).score(candidates).probs
    many = Scorer.in_process(tiny_target, batch_size=8, prefix_reuse=False).score(candidates).probs
    assert np.abs(one - many).max() < 1e-5
    assert np.allclose(one.sum(-1), 1.0)
    assert len({tuple(np.round(p, 6)) for p in one}) > 1  # the fixture model is not constant


def test_restricted_softmax_equals_full_vocabulary(tiny_target, seed_items):
    scorer = Scorer.in_process(tiny_target, batch_size=4, prefix_reuse=False)
    candidate = roots(seed_items, 1)[0]
    got = scorer.score([candidate]).probs[0]
    ids = tiny_target.tokenizer(render(candidate, tiny_target.tokenizer, scorer.fmt), return_tensors="pt")
    with torch.no_grad():
        full = torch.softmax(tiny_target.model(**ids).logits[0, -1].double(), -1)
    letters = full[scorer.backend.letter_ids]
    assert np.abs(got - (letters / letters.sum()).numpy()).max() < 1e-5


def test_option_permutation_maps_back_to_answers(tiny_scorer, seed_items):
    candidate = roots(seed_items, 1)[0]
    rotated = replace(candidate, option_order=(2, 0, 1))
    letters = tiny_scorer.score([rotated]).letters[0, 0]
    probs = tiny_scorer.score([rotated]).probs[0]
    # slot s shows answer order[s]: P(answer order[s]) must equal P(letter s)
    assert np.allclose([probs[2], probs[0], probs[1]], letters)
    prompt = render(rotated, tiny_scorer.target.tokenizer, tiny_scorer.fmt)
    answers = candidate.item.answers
    assert f"(A) {answers[2]}\n(B) {answers[0]}\n(C) {answers[1]}" in prompt


def test_order_averaging_is_order_invariant(tiny_target, seed_items):
    scorer = Scorer.in_process(tiny_target, average_orders=True)
    candidate = roots(seed_items, 1)[0]
    a = scorer.score([candidate]).probs[0]
    b = scorer.score([replace(candidate, option_order=(1, 2, 0))]).probs[0]
    assert np.abs(a - b).max() < 1e-6
    assert scorer.queries == 3  # the rotation reuses the three cached prompts


def test_prefix_reuse_matches_full_scoring(tiny_target, seed_items):
    base = replace(roots(seed_items, 1)[0], persona="You are a careful and fair assistant who reads every option.")
    variants = [base.with_words("test", "question", k, w) for k, w in enumerate(["Which", "Whom", "Who"])]
    variants += [base.with_words("test", "question", 1, "person"), base]
    plain = Scorer.in_process(tiny_target, prefix_reuse=False, batch_size=2).score(variants).probs
    reused = Scorer.in_process(tiny_target, prefix_reuse=True, batch_size=2, min_shared_prefix=8,
                    min_prefix_saving=0.0).score(variants).probs
    assert np.abs(plain - reused).max() < 1e-5


def test_shared_prefix_groups():
    seqs = [[1, 2, 3, 4, 5], [1, 2, 3, 9], [7, 8], [1, 2, 3, 4, 6]]
    groups = shared_prefix_groups(seqs, min_prefix=3)
    assert {tuple(sorted(m)): p for p, m in groups} == {(0, 1, 3): 3, (2,): 0}
    assert shared_prefix_groups([[1, 2], [3, 4], [5, 6, 7]], 2) == [(0, [0, 1, 2])]
    # a short prefix shared by a few long prompts saves too little to be worth its own forward pass
    assert shared_prefix_groups([[1, 2, 3, *range(10, 20)], [1, 2, 3, *range(30, 40)]], 2, 0.5) == [(0, [0, 1])]
    assert shared_prefix_groups([[*range(10), 50], [*range(10), 60]], 2, 0.4) == [(10, [0, 1])]
    # two families with long prefixes of their own, sharing a short one, stay two groups
    family_a = [[1, 2, 3, *range(100, 120), k] for k in range(4)]
    family_b = [[1, 2, 3, *range(200, 220), k] for k in range(4)]
    assert sorted((p, sorted(m)) for p, m in shared_prefix_groups(family_a + family_b, 2, 0.5)) == [
        (23, [0, 1, 2, 3]), (23, [4, 5, 6, 7])]
    # the prefix never swallows a whole sequence
    assert shared_prefix_groups([[1, 2, 3], [1, 2, 3, 4]], 2) == [(2, [0, 1])]


def test_cache_counts_each_prompt_once(tiny_scorer, seed_items):
    candidates = roots(seed_items, 3)
    first = tiny_scorer.score([*candidates, candidates[0]])
    assert tiny_scorer.queries == 3  # the repeated candidate is scored once
    again = tiny_scorer.score(candidates)
    assert tiny_scorer.queries == 3
    assert np.allclose(again.probs, first.probs[:3])


def test_out_of_memory_halves_the_batch(tiny_target, seed_items, monkeypatch):
    scorer = Scorer.in_process(tiny_target, batch_size=8, prefix_reuse=False)
    original = InProcessBackend._run

    def limited(self, prefix_cache, prefix_len, suffixes):
        if len(suffixes) > 2:
            raise torch.OutOfMemoryError("simulated")
        return original(self, prefix_cache, prefix_len, suffixes)

    monkeypatch.setattr(InProcessBackend, "_run", limited)
    probs = scorer.score(roots(seed_items, 6)).probs
    assert scorer.backend.batch_size == 2
    expected = Scorer.in_process(tiny_target, batch_size=1, prefix_reuse=False).score(roots(seed_items, 6)).probs
    monkeypatch.undo()
    assert np.abs(probs - expected).max() < 1e-5


def test_letter_that_is_not_one_token_fails_clearly(tiny_target):
    with pytest.raises(FlexsearchError, match="not a single token"):
        letter_token_ids(tiny_target.tokenizer, "Answer: ")  # ' A' may merge; a bare prefix with no '('
    assert len(set(letter_token_ids(tiny_target.tokenizer, "Answer: ("))) == 3


def test_the_slot_places_the_attack_in_the_user_turn_or_a_system_message(tiny_target, seed_items):
    persona = "You are a gossip who judges people by their looks."
    attacked = roots(seed_items, 1)[0].with_slot("persona", "persona", persona, family="test", template=0)
    user = Scorer.in_process(tiny_target, PromptFormat(mode="chat"))
    system = Scorer.in_process(tiny_target, PromptFormat(mode="chat", slot="system"))
    assert user.render(attacked).startswith(f"<|user|>{persona}\nQ: ")
    assert system.render(attacked).startswith(f"<|system|>{persona}<|end|>\n<|user|>Q: ")
    clean = roots(seed_items, 1)[0]  # no attack text: no system message, the same prompt in both slots
    assert system.render(clean) == user.render(clean)
    facts = system.info["prompt_format"]
    assert facts["slot"] == "system" and facts["system_role"] is True and len(facts["chat_template_sha256"]) == 64
    assert user.info["prompt_format"]["chat_template_sha256"] == facts["chat_template_sha256"]
    assert not np.allclose(system.score([attacked]).probs, user.score([attacked]).probs)
    with pytest.raises(FlexsearchError, match="--slot system puts the attack in a system message, which only chat"):
        PromptFormat(mode="plain", slot="system")


@pytest.mark.parametrize("template", [
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ raise_exception('no system role') }}{% endif %}"
    "<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>",  # refuses it
    "{% for m in messages if m['role'] != 'system' %}<|{{ m['role'] }}|>{{ m['content'] }}{% endfor %}<|assistant|>",
])  # the second drops it silently
def test_a_template_without_a_system_role_refuses_the_system_slot(tiny_target, template, monkeypatch):
    monkeypatch.setattr(tiny_target.tokenizer, "chat_template", template)
    assert chat_template_facts(tiny_target.tokenizer, "tiny")["system_role"] is False
    with pytest.raises(FlexsearchError, match="the chat template of .* does not take a system role.*use --slot user"):
        Scorer.in_process(tiny_target, PromptFormat(mode="chat", slot="system"))
    assert Scorer.in_process(tiny_target, PromptFormat(mode="chat")).info["prompt_format"]["system_role"] is False


def test_chat_mode_wraps_in_the_template(tiny_target, seed_items):
    scorer = Scorer.in_process(tiny_target, PromptFormat(mode="chat"))
    prompt = scorer.prompts(roots(seed_items, 1)[0])[0][0]
    assert prompt.startswith("<|user|>Q: ") and prompt.endswith("<|assistant|>Answer: (")
    assert np.allclose(scorer.score(roots(seed_items, 2)).probs.sum(-1), 1)


# ---------------------------------------------------------------- the backend seam (issue 47)


def test_the_model_spec_prefix_picks_the_backend():
    from flexsearch.scoring.backends.base import IN_PROCESS, backend_name, load_backends

    load_backends()
    assert backend_name("openai:qwen") == "openai"
    for spec in ("smollm2", "HuggingFaceTB/SmolLM2-135M-Instruct", "C:/models/gemma", "runs/x.gguf", "in_process:x"):
        assert backend_name(spec) == IN_PROCESS, spec


def test_a_new_backend_is_one_class_and_its_registration(monkeypatch, tiny_target, seed_items):
    """A backend registered under a prefix is what build_scorer connects for a spec carrying that prefix; the
    Scorer over it renders, orders and caches as over any other."""
    from flexsearch.config import ScoringConfig
    from flexsearch.scoring.backends import base
    from flexsearch.scoring.scorer import build_scorer

    monkeypatch.setattr(base.BACKENDS, "_entries", dict(base.BACKENDS._entries))
    asked: list[dict] = []

    @base.BACKENDS.register("echo")
    class Echo(InProcessBackend):
        """Scores in process, but is reached as echo:NAME (a stand-in for a new server kind)."""

        @classmethod
        def connect(cls, target, scoring: ScoringConfig):
            asked.append(target)
            return cls.from_config(tiny_target, scoring)

    scorer = build_scorer({"model": "echo:tiny", "adapter": None}, {"average_orders": False, "batch_size": 4})
    assert isinstance(scorer.backend, Echo) and asked == [{"model": "echo:tiny"}]  # unset options left out
    probs = scorer.score(roots(seed_items, 3)).probs
    assert probs.shape == (3, 3) and np.allclose(probs.sum(-1), 1.0)
    with pytest.raises(FlexsearchError, match="unknown scoring backend 'ecoh'. Did you mean 'echo'"):
        base.BACKENDS.get("ecoh")


def test_served_options_are_declared_once_for_the_cli_the_api_and_the_checks():
    import inspect
    from dataclasses import fields
    from typing import get_type_hints

    from typer.main import get_command

    from flexsearch.api import Target
    from flexsearch.cli import app
    from flexsearch.scoring.backends.served_options import SERVED_OPTIONS, ServedFields, served_options

    # the one declaration: Target's served fields are ServedFields' own, with their types and defaults
    declared = {f.name for f in fields(ServedFields)}
    assert [o.name for o in SERVED_OPTIONS] == [f.name for f in fields(ServedFields)] and len(declared) == 9
    hints = get_type_hints(Target)
    for option in SERVED_OPTIONS:
        assert hints[option.name] == option.annotation and option.help
    parameters = inspect.signature(Target).parameters
    assert list(parameters)[0] == "model" and all(parameters[n].kind is inspect.Parameter.KEYWORD_ONLY
                                                   for n in declared)
    assert Target("openai:m", samples=3).samples == 3 and Target().samples == ServedFields().samples
    search = get_command(app).commands["search"]  # type: ignore[attr-defined]
    flags = {p.name: p for p in search.params}
    for option in SERVED_OPTIONS:
        assert flags[option.name].default == option.default and option.help.split()[0] in flags[option.name].help
    assert flags["temperature"].max == 2 and flags["samples"].min == 1  # the bounds reach the CLI
    base = {"model": "openai:m", "base_url": "http://127.0.0.1:8000/v1"}
    for option, bad, message in (("samples", 0, "--samples: must be a whole number of at least 1"),
                                 ("retries", True, "--retries: must be a whole number of at least 0"),
                                 ("temperature", 2.5, "--temperature: must be between 0 and 2"),
                                 ("request_timeout", 0.05, "--request-timeout: must be at least 0.1")):
        with pytest.raises(FlexsearchError, match=f"^{message}$"):
            served_options({**base, option: bad}, "plain")
    assert served_options({**base, "samples": 1, "temperature": 0, "request_timeout": 0.1}, "plain") is not None
