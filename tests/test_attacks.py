"""Operators and constraints: valid distinct candidates, rebuildable provenance, protected spans."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from flexsearch.attacks import CONSTRAINTS, OPERATORS, AttackResources, build
from flexsearch.attacks.constraints import PolarityGuard, protected_positions
from flexsearch.attacks.importance import leave_one_out_probes
from flexsearch.attacks.neighbours import EmbeddingNeighbours, WordNetNeighbours, wordnet_root
from flexsearch.attacks.templates import INSTRUCTION_FAMILIES, PERSONA_FAMILIES, fill
from flexsearch.data.candidate import Candidate, replay
from flexsearch.errors import FlexsearchError

needs_wordnet = pytest.mark.skipif(wordnet_root() is None, reason="Debian's wordnet-base is not installed")
NO_WORDNET = ["insert", "delete", "swap", "sub_c"]


@pytest.fixture(scope="session")
def tiny_mlm_dir(tmp_path_factory) -> Path:
    """A tiny random-weight BERT masked LM with a WordPiece vocabulary trained on the seed texts."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import BertConfig, BertForMaskedLM, PreTrainedTokenizerFast

    from flexsearch.data.items import load_items

    corpus = [f"{it.context} {it.question}" for it in load_items("seed").items]
    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(corpus, trainers.WordPieceTrainer(
        vocab_size=400, special_tokens=["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]))
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, unk_token="[UNK]", pad_token="[PAD]",
                                   cls_token="[CLS]", sep_token="[SEP]", mask_token="[MASK]")
    directory = tmp_path_factory.mktemp("tiny-bert")
    fast.save_pretrained(directory)
    import torch

    torch.manual_seed(0)
    BertForMaskedLM(BertConfig(vocab_size=len(fast), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                               intermediate_size=64, max_position_embeddings=256)).save_pretrained(directory)
    return directory


def operator_specs(tiny_mlm_dir: Path) -> list[dict]:
    specs = [{"name": "persona", "n": 3}, {"name": "instruction", "n": 3},
             {"name": "textbugger", "bugs": NO_WORDNET, "positions": 3},
             {"name": "bert_attack", "model": str(tiny_mlm_dir), "positions": 2}]
    if wordnet_root() is not None:
        specs.append({"name": "textbugger", "bugs": ["sub_w"], "positions": 3})
    return specs


def test_operators_propose_distinct_rebuildable_candidates(tiny_mlm_dir, seed_items):
    rng = np.random.default_rng(0)
    for spec in operator_specs(tiny_mlm_dir):
        op = build(OPERATORS, spec, AttackResources())
        produced = 0
        for item in seed_items[:12]:
            root = Candidate.root(item)
            children = op.propose(root, rng)
            keys = [(c.instruction, c.context, c.question) for c in children]
            assert len(keys) == len(set(keys)), spec
            for child in children:
                assert child.parent is root and child.edits[-1].operator == op.name
                assert (child.instruction, child.context, child.question) != (root.instruction, root.context,
                                                                              root.question)
                rebuilt = replay(item, child.chain())
                assert (rebuilt.instruction, rebuilt.context, rebuilt.question) == (
                    child.instruction, child.context, child.question)
            produced += len(children)
        assert produced > 0, spec


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(index=st.integers(0, 71), seed=st.integers(0, 2**32 - 1), depth=st.integers(1, 3))
def test_word_operators_never_touch_protected_spans(seed_items, index, seed, depth):
    item = seed_items[index]
    op = build(OPERATORS, {"name": "textbugger", "bugs": NO_WORDNET, "positions": 4}, AttackResources())
    rng = np.random.default_rng(seed)
    candidate = Candidate.root(item)
    for _ in range(depth):
        children = op.propose(candidate, rng)
        if not children:
            break
        candidate = children[int(rng.integers(len(children)))]
    protected = protected_positions(item)
    for edit in candidate.edits:
        assert (edit.field, edit.position) not in protected
    for answer in item.answers:  # answer texts are never edited
        assert answer in candidate.item.answers
    for k in (item.target, item.anti_target):  # the people are still named in the context
        person = item.answers[k].split()[-1].strip(".").lower()
        assert person in candidate.context.lower() or person not in item.context.lower()


def test_disambiguated_evidence_is_protected(seed_items):
    item = next(it for it in seed_items if it.condition == "disambig")
    words = item.context.split(" ")
    evidence_start = len(next(it for it in seed_items if it.condition == "ambig"
                              and it.source["question_index"] == item.source["question_index"]).context.split(" "))
    assert all(("context", i) in protected_positions(item) for i in range(evidence_start, len(words)))


def constraint(name, **settings):
    return build(CONSTRAINTS, {"name": name, **settings}, AttackResources())


def test_constraints_reject_what_they_must_and_accept_a_typo(seed_items):
    item = next(it for it in seed_items if "unable" in it.question)
    root = Candidate.root(item)
    unable = item.question.split(" ").index("unable")
    flipped = root.with_words("test", "question", unable, "able")
    group_word = min(i for f, i in protected_positions(item) if f == "context")
    renamed = root.with_words("test", "context", group_word, "someone")
    rewrite = root
    for position in range(len(root.context_words)):
        rewrite = rewrite.with_words("test", "context", position, "banana") if position != group_word else rewrite
    typo = root.with_words("test", "question", unable, "unabel")
    guard, spans = PolarityGuard(AttackResources()), constraint("protected_spans")
    similarity, budget = constraint("similarity", threshold=0.8), constraint("edit_budget", max_share=0.25)
    assert guard.accept([flipped, typo]) == [False, True]
    assert spans.accept([renamed, typo]) == [False, True]
    assert similarity.accept([rewrite, typo]) == [False, True]
    assert budget.accept([rewrite, typo]) == [False, True]
    less = Candidate.root(item).with_words("test", "question", 0, "less")
    assert guard.accept([less.with_words("test", "question", 0, "more")]) == [False]
    assert constraint("unique_positions").accept([typo.with_words("test", "question", unable, "unable"), typo]) == [
        False, True]


@needs_wordnet
def test_wordnet_neighbours_and_antonyms():
    wordnet = WordNetNeighbours()
    assert "big" in wordnet.neighbours("large", 20)
    assert "uncomfortable" in wordnet.antonyms("comfortable")
    assert PolarityGuard(AttackResources()).flips("clean", "dirty")


def test_embedding_neighbours_from_file_and_target(tmp_path, tiny_target):
    vectors = tmp_path / "vectors.txt"
    vectors.write_text("3 2\nking 1.0 0.1\nqueen 0.9 0.2\napple -1.0 0.3\n")
    source = EmbeddingNeighbours.from_file(vectors)
    assert source.neighbours("king", 1) == ["queen"] and source.neighbours("zebra", 3) == []
    from_model = EmbeddingNeighbours.from_target(tiny_target)
    assert from_model.words and all(w.isalpha() for w in from_model.words)
    assert len(from_model.neighbours(from_model.words[0], 3)) == 3


def test_templates_render_for_every_category(seed_items):
    assert len(PERSONA_FAMILIES) >= 5 and len(INSTRUCTION_FAMILIES) >= 5
    for item in {it.category: it for it in seed_items}.values():
        for family in PERSONA_FAMILIES.values():
            for template in family:
                text = fill(template.text, item)
                assert text is not None and "{" not in text and len(text) > 20


def test_registry_suggests_close_names():
    with pytest.raises(FlexsearchError, match="Did you mean 'textbugger'"):
        OPERATORS.get("textbuger")
    with pytest.raises(FlexsearchError, match="bad settings"):
        build(OPERATORS, {"name": "persona", "colour": "red"}, AttackResources())


def test_leave_one_out_probes_delete_each_position(seed_items):
    from flexsearch.attacks.constraints import editable_positions

    root = Candidate.root(seed_items[0])
    positions = editable_positions(root)
    probes = leave_one_out_probes(root, positions)
    assert [p.words(f)[i] for p, (f, i) in zip(probes, positions, strict=True)] == [""] * len(positions)
