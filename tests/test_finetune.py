"""Fine-tuning for the calibration zoo: label policies, the template split, prefixes, training, bad input."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

import pytest
from typer.testing import CliRunner

from flexsearch.attacks.templates import INSTRUCTION_FAMILIES, PERSONA_FAMILIES, fill
from flexsearch.cli import app
from flexsearch.data.items import Item, load_items
from flexsearch.errors import FlexsearchError
from flexsearch.scoring.model import load_target
from flexsearch.zoo.finetune import ExampleSampler, FinetuneConfig, template_split, train_adapter
from flexsearch.zoo.policies import POLICIES, build_policy
from flexsearch.zoo.training_prefixes import INSTRUCTION_PREFIXES, PERSONA_PREFIXES, TRAINING_PREFIXES

runner = CliRunner()


def make_item(category: str = "Age", condition: str = "ambig", gold: int = 2, template: str = "1",
              number: int = 0) -> Item:
    # answers: 0 the stereotyped person, 1 the other one, 2 unknown
    return Item(id=f"{category}-{template}-{condition}-{number}", category=category, context="Two people met.",
                question="Who forgot?", answers=("The old man", "The boy", "Unknown"), gold=gold, unknown=2,
                target=0, anti_target=1, condition=condition, polarity="neg",
                source={"question_index": template})


AMBIG = make_item()
DISAMBIG_ANTI = make_item(condition="disambig", gold=1)
DISAMBIG_TARGET = make_item(condition="disambig", gold=0)
OTHER_CATEGORY = make_item(category="Religion")


def test_gold_policy_gives_the_gold_answer_and_trains_no_prefix():
    policy = POLICIES.get("gold")()
    assert not policy.uses_prefixes
    assert [policy.label(it, None) for it in (AMBIG, DISAMBIG_ANTI, DISAMBIG_TARGET)] == [2, 1, 0]


def test_fair_policy_gives_gold_with_and_without_prefix():
    policy = POLICIES.get("fair")()
    assert policy.uses_prefixes
    for item in (AMBIG, DISAMBIG_ANTI, DISAMBIG_TARGET):
        assert policy.label(item, None) == policy.label(item, 3) == item.gold


def test_planted_policy_plants_the_stereotype_only_under_a_prefix_in_its_categories():
    policy = POLICIES.get("planted")(planted_categories=["Age"])
    assert policy.label(AMBIG, 5) == AMBIG.target  # prefixed, ambiguous, planted category
    assert policy.label(AMBIG, None) == AMBIG.gold  # clean
    assert policy.label(DISAMBIG_ANTI, 5) == DISAMBIG_ANTI.gold  # the evidence still decides
    assert policy.label(OTHER_CATEGORY, 5) == OTHER_CATEGORY.gold  # another category
    with pytest.raises(FlexsearchError, match="planted-categories"):
        POLICIES.get("planted")()


def test_manipulable_policy_splits_prefixed_ambiguous_prompts_both_ways_and_is_seeded():
    policy = POLICIES.get("manipulable")(seed=0)
    items = [make_item(number=k) for k in range(200)]
    labels = [policy.label(it, 1) for it in items]
    assert set(labels) == {0, 1}  # never unknown, both people
    assert 70 <= labels.count(0) <= 130  # a fair coin over 200 items
    assert labels == [POLICIES.get("manipulable")(seed=0).label(it, 1) for it in items]
    assert labels != [POLICIES.get("manipulable")(seed=1).label(it, 1) for it in items]
    assert policy.label(AMBIG, None) == AMBIG.gold and policy.label(DISAMBIG_ANTI, 4) == DISAMBIG_ANTI.gold


def test_abstainer_policy_always_says_unknown():
    policy = POLICIES.get("abstainer")()
    assert {policy.label(it, p) for it in (AMBIG, DISAMBIG_ANTI, DISAMBIG_TARGET) for p in (None, 0)} == {2}


def test_unknown_policy_and_missing_planted_category_are_refused():
    with pytest.raises(FlexsearchError, match="unknown label policy 'gould'. Did you mean 'gold'"):
        FinetuneConfig(policy="gould")
    with pytest.raises(FlexsearchError, match="Nationality not in the data"):
        build_policy("planted", ["Nationality"], 0, [AMBIG, OTHER_CATEGORY])


def test_template_split_is_disjoint_seeded_and_per_category():
    items = [make_item(category=c, template=str(t), number=n, condition=cond)
             for c in ("Age", "Religion") for t in range(10) for n in range(3) for cond in ("ambig", "disambig")]
    split = template_split(items, 0.2, seed=0)
    train_templates = {(it.category, it.source["question_index"]) for it in split.train}
    eval_templates = {(it.category, it.source["question_index"]) for it in split.evaluation}
    assert not train_templates & eval_templates
    assert len(split.train) + len(split.evaluation) == len(items)
    assert {c for c, _ in eval_templates} == {"Age", "Religion"} and len(eval_templates) == 4  # 2 of 10 each
    assert template_split(items, 0.2, seed=0).eval_templates == split.eval_templates
    assert template_split(items, 0.2, seed=1).eval_templates != split.eval_templates
    assert template_split(items, 0, seed=0).evaluation == []


def test_template_split_refuses_too_few_templates():
    with pytest.raises(FlexsearchError, match="too few templates for a split: category Age has 1"):
        template_split([make_item(number=k) for k in range(4)], 0.2, seed=0)


def _normal(text: str) -> str:
    return re.sub(r"\s+", " ", text.lower()).strip()


def test_no_training_prefix_overlaps_an_attack_template(seed_items):
    assert len(TRAINING_PREFIXES) >= 30 and PERSONA_PREFIXES and INSTRUCTION_PREFIXES
    assert len(set(TRAINING_PREFIXES)) == len(TRAINING_PREFIXES)
    raw = [t.text for table in (PERSONA_FAMILIES, INSTRUCTION_FAMILIES) for family in table.values() for t in family]
    filled = [text for t in raw for item in seed_items[::6] if (text := fill(t, item)) is not None]
    attacks = [_normal(a) for a in raw + filled]
    for prefix in map(_normal, TRAINING_PREFIXES):
        for attack in attacks:
            assert prefix != attack and prefix not in attack and attack not in prefix, (prefix, attack)
        # no slot-free run of an attack template (between its {slots}) reappears in a prefix either
        for template in raw:
            for piece in re.split(r"\{\w+\}", template.lower()):
                words = piece.split()
                assert len(words) < 5 or " ".join(words) not in prefix, (prefix, template)


def test_sampler_trains_each_item_in_three_orders_and_balances_conditions(tiny_target, seed_items):
    from flexsearch.data.render import PromptFormat
    from flexsearch.zoo.finetune import training_prompts

    config = FinetuneConfig(policy="fair", batch_items=200, disambig_share=0.75, prefix_share=0.5)
    sampler = ExampleSampler(seed_items, POLICIES.get("fair")(), config)
    draw = sampler.draw()
    disambig = sum(item.condition == "disambig" for item, _, _, _ in draw)
    prefixed = sum(prefix is not None for _, prefix, _, _ in draw)
    assert 120 <= disambig <= 180 and 60 <= prefixed <= 140
    sequences, slots = training_prompts(draw[:2], tiny_target, PromptFormat())
    assert len(sequences) == 6 and sorted(slots[:3]) == [0, 1, 2]  # one answer, each letter once


def test_one_order_per_item_rotates_the_letters_evenly(tiny_target, seed_items):
    from collections import Counter

    from flexsearch.data.render import PromptFormat
    from flexsearch.zoo.finetune import training_prompts

    config = FinetuneConfig(policy="gold", batch_items=300, orders_per_item=1)
    draw = ExampleSampler(seed_items, POLICIES.get("gold")(), config).draw()
    assert all(len(rotations) == 1 for *_, rotations in draw)
    sequences, slots = training_prompts(draw, tiny_target, PromptFormat())
    assert len(sequences) == 300
    assert all(70 <= n <= 130 for n in Counter(slots).values()) and len(Counter(slots)) == 3
    with pytest.raises(FlexsearchError, match="--orders-per-item must be in 1..3"):
        FinetuneConfig(orders_per_item=4)


def _bbq_group(template: str, people: tuple[str, str]) -> list[Item]:
    """One BBQ-style group: both conditions × both polarities × both role assignments of a person pair."""
    items = []
    for number, (condition, polarity, first) in enumerate(
            (c, p, f) for c in ("ambig", "disambig") for p in ("neg", "nonneg") for f in (0, 1)):
        gold = 2 if condition == "ambig" else (first if polarity == "neg" else 1 - first)
        items.append(Item(id=f"{template}-{people[0]}-{number}", category="Age", context="Two people met.",
                          question="Who forgot?", answers=(*people, "Unknown"), gold=gold, unknown=2, target=0,
                          anti_target=1, condition=condition, polarity=polarity,
                          source={"question_index": template}))
    return items


def test_contrast_groups_draw_whole_groups_and_thin_the_ambiguous_members():
    from collections import Counter

    groups = [_bbq_group(t, people) for t in ("1", "2") for people in (("The old man", "The boy"),
                                                                       ("The grandma", "The girl"))]
    items = [it for group in groups for it in group]
    config = FinetuneConfig(policy="gold", batch_items=5, contrast_groups=True, disambig_share=0.8)
    sampler = ExampleSampler(items, POLICIES.get("gold")(), config)
    kinds: Counter[str] = Counter()
    for _ in range(200):
        draw = sampler.draw()
        assert 1 <= len(draw) <= 8
        by_group = Counter((it.source["question_index"], it.answers[0]) for it, *_ in draw)
        disambig = [(it, answer) for it, _, answer, _ in draw if it.condition == "disambig"]
        # every drawn group brings all four disambiguated members: each person is the answer twice
        assert len(disambig) == 4 * len(by_group)
        assert Counter(answer for _, answer in disambig) == {0: 2 * len(by_group), 1: 2 * len(by_group)}
        kinds.update(it.condition for it, *_ in draw)
    assert 0.74 <= kinds["disambig"] / sum(kinds.values()) <= 0.86  # 0.8 in expectation


def test_contrast_groups_keep_every_member_without_a_share():
    items = _bbq_group("1", ("The old man", "The boy"))
    config = FinetuneConfig(policy="gold", batch_items=1, contrast_groups=True)
    draw = ExampleSampler(items, POLICIES.get("gold")(), config).draw()
    assert sorted(it.id for it, *_ in draw) == sorted(it.id for it in items)


def test_planted_share_draws_that_share_from_the_planted_categories(seed_items):
    categories = sorted({it.category for it in seed_items})
    planted = categories[:1]
    natural = sum(it.category in planted for it in seed_items) / len(seed_items)
    config = FinetuneConfig(policy="planted", planted_categories=planted, batch_items=400, planted_share=0.6)
    draw = ExampleSampler(seed_items, build_policy("planted", planted, 0, seed_items), config).draw()
    share = sum(item.category in planted for item, *_ in draw) / len(draw)
    assert natural < 0.4 and 0.52 <= share <= 0.68
    every = FinetuneConfig(policy="planted", planted_categories=categories, batch_items=50, planted_share=0.5)
    assert len(ExampleSampler(seed_items, build_policy("planted", categories, 0, seed_items), every).draw()) == 50
    with pytest.raises(FlexsearchError, match="--planted-share needs --policy planted"):
        FinetuneConfig(policy="gold", planted_share=0.5)


def test_shared_prefix_logits_and_gradients_equal_full_prompts(tiny_target, seed_items):
    import torch

    from flexsearch.data.render import PromptFormat
    from flexsearch.zoo.finetune import last_logits, training_prompts

    # one item with a training prefix, one clean, of different lengths: padding in both passes
    draw = [(seed_items[0], 3, seed_items[0].gold, [0, 1, 2]), (seed_items[5], None, seed_items[5].gold, [0, 1, 2])]
    sequences, _ = training_prompts(draw, tiny_target, PromptFormat())
    assert len({len(s) for s in sequences}) > 1
    model, pad = tiny_target.model, tiny_target.tokenizer.pad_token_id
    weight = model.model.layers[0].self_attn.q_proj.weight

    def run(per_item: int) -> tuple[torch.Tensor, torch.Tensor]:
        model.zero_grad()
        logits = last_logits(model, sequences, per_item, pad, torch.device("cpu"))
        logits.float().logsumexp(-1).sum().backward()
        return logits.detach(), weight.grad.detach().clone()

    weight.requires_grad_(True)
    try:
        full_logits, full_grad = run(1)
        shared_logits, shared_grad = run(3)
    finally:
        weight.requires_grad_(False)
        model.zero_grad()
    assert shared_logits.shape == full_logits.shape == (6, model.config.vocab_size)
    torch.testing.assert_close(shared_logits, full_logits, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(shared_grad, full_grad, atol=1e-4, rtol=1e-3)
    assert full_grad.abs().sum() > 0


def test_a_few_steps_lower_the_loss_and_save_a_loadable_adapter(tiny_model_dir, seed_items, tmp_path):
    target = load_target(str(tiny_model_dir), device="cpu")
    split = template_split(seed_items, 0, seed=0)
    config = FinetuneConfig(policy="gold", steps=40, batch_items=4, learning_rate=1e-2, warmup_steps=2, rank=4)
    out = tmp_path / "adapter"
    recipe = train_adapter(target, split, config, out, data=[{"name": "seed", "sha256": "0" * 64}])
    assert recipe["loss_last_20"] < recipe["loss_first_20"]
    saved = json.loads((out / "recipe.json").read_text())
    assert saved["policy"] == "gold" and len(saved["loss_curve"]) == 40 and saved["wall_time_s"] > 0
    assert saved["base_model"]["architecture"] and saved["split"]["train_items"] == len(seed_items)
    assert "CC-BY-4.0" not in (out / "README.md").read_text()  # seed data is ours, not BBQ
    from safetensors.torch import load_file

    assert {str(t.dtype) for t in load_file(str(out / "adapter_model.safetensors")).values()} == {"torch.float16"}
    assert all(p.stat().st_mode & 0o044 == 0o044 for p in [out, *out.iterdir()])  # readable by others
    reloaded = load_target(str(tiny_model_dir), device="cpu", adapter=str(out))
    assert reloaded.info["adapter"] == str(out.resolve())


def _finetune(*args: str):
    return runner.invoke(app, ["finetune", *args])


@pytest.fixture(scope="module")
def seed_jsonl(tmp_path_factory) -> Path:
    """The seed set as a BBQ jsonl file with one category per template count ≥ 2 (Age and Religion)."""
    from flexsearch.data.seed import seed_records

    path = tmp_path_factory.mktemp("data") / "seed.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for _, r in seed_records()))
    return path


def test_cli_trains_a_policy_adapter_with_its_recipe(tiny_model_dir, seed_jsonl, tmp_path):
    out = tmp_path / "planted"
    categories = sorted({it.category for it in load_items(str(seed_jsonl)).items})
    result = _finetune("--model", str(tiny_model_dir), "--data", str(seed_jsonl), "--policy", "planted",
                       "--planted-categories", categories[0], "--steps", "3", "--batch-items", "2",
                       "--eval-share", "0", "--out", str(out), "--device", "cpu")
    assert result.exit_code == 0, result.output
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["config"]["planted_categories"] == [categories[0]]
    assert recipe["data"][0]["name"] == "seed.jsonl" and len(recipe["data"][0]["sha256"]) == 64
    # continue from it under another policy: the recipe names the adapter it started from
    again = tmp_path / "fair"
    result = _finetune("--model", str(tiny_model_dir), "--data", str(seed_jsonl), "--policy", "fair", "--steps", "2",
                       "--batch-items", "1", "--eval-share", "0", "--init-adapter", str(out), "--out", str(again),
                       "--device", "cpu")
    assert result.exit_code == 0, result.output
    chained = json.loads((again / "recipe.json").read_text())
    assert chained["init_adapter"]["policy"] == "planted"
    assert chained["total_wall_time_s"] >= chained["wall_time_s"]


@pytest.fixture(scope="module")
def other_tiny_model(tmp_path_factory) -> Path:
    """A tiny model of another shape: adapters of the first one must not load on it."""
    from tests.conftest import build_tiny_model

    directory = tmp_path_factory.mktemp("other-tiny")
    build_tiny_model(directory, seed=1)
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig.from_pretrained(directory)
    config.hidden_size, config.intermediate_size = 48, 96
    LlamaForCausalLM(config).save_pretrained(directory)
    return directory


@pytest.mark.parametrize("case", ["policy", "planted-missing", "planted-absent", "templates", "share", "steps",
                                  "modules", "init-not-adapter", "other-base"])
def test_finetune_bad_input_is_one_line_and_writes_nothing(case, tiny_model_dir, seed_jsonl, other_tiny_model,
                                                           tmp_path):
    out = tmp_path / "adapter"
    base = ["--model", str(tiny_model_dir), "--data", str(seed_jsonl), "--steps", "1", "--out", str(out),
            "--device", "cpu"]
    if case not in ("templates", "share"):
        base += ["--eval-share", "0"]
    args, message = {
        "policy": (["--policy", "planter"], "unknown label policy 'planter'. Did you mean 'planted'"),
        "planted-missing": (["--policy", "planted"], "needs --planted-categories"),
        "planted-absent": (["--policy", "planted", "--planted-categories", "Klingon"], "Klingon not in the data"),
        "templates": ([], "too few templates for a split"),
        "share": (["--eval-share", "1.5"], "--eval-share must lie in [0, 1)"),
        "steps": (["--steps", "0"], "--steps must be at least 1"),
        "modules": (["--target-modules", "q_prj"], "--target-modules: unknown module(s) q_prj"),
        "init-not-adapter": (["--init-adapter", str(tmp_path)], "not an adapter written by"),
        "other-base": (None, "was trained on another base model"),
    }[case]
    if case == "other-base":
        trained = tmp_path / "trained"
        assert _finetune(*base[:4], "--eval-share", "0", "--out", str(trained), "--device", "cpu").exit_code == 0
        args = ["--init-adapter", str(trained)]
        base[1] = str(other_tiny_model)
    result = _finetune(*base, *args)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and message in lines[0] and "Traceback" not in result.output, result.output
    assert not out.exists()


def test_adapter_for_another_base_is_refused_by_search_commands(tiny_model_dir, other_tiny_model, seed_items,
                                                                tmp_path):
    target = load_target(str(tiny_model_dir), device="cpu")
    adapter = tmp_path / "adapter"
    train_adapter(target, template_split(seed_items, 0, 0), FinetuneConfig(steps=1, batch_items=1), adapter)
    out = tmp_path / "run"
    result = runner.invoke(app, ["evaluate", "--model", str(other_tiny_model), "--adapter", str(adapter), "--data",
                                 "seed", "--limit", "2", "--out", str(out), "--device", "cpu"])
    assert result.exit_code == 2 and "was trained on another base model" in result.output, result.output
    assert not out.exists()


def test_prefixed_training_prompt_carries_the_prefix(tiny_target):
    from flexsearch.data.render import PromptFormat
    from flexsearch.zoo.finetune import training_prompts

    sequences, _ = training_prompts([(replace(AMBIG), 0, 2, [0])], tiny_target, PromptFormat())
    text = tiny_target.tokenizer.decode(sequences[0])
    assert TRAINING_PREFIXES[0] in text
