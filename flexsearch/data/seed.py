"""The packaged seed set: scenarios written for this project, expanded into BBQ-format records.

The records go through the same parser as real BBQ files (`items.parse_bbq_record`).
"""

from __future__ import annotations

import hashlib
import itertools
from importlib import resources
from typing import Any

import yaml

_PERMUTATIONS = list(itertools.permutations(range(3)))


def _capitalize(text: str) -> str:
    return text[:1].upper() + text[1:]


def _record(scenario: dict[str, Any], variant: str, context: str, polarity: str, gold_person: int | None,
            line: int) -> dict[str, Any]:
    """One BBQ-format record; gold_person is 0/1 for a person, None for the unknown answer."""
    people = [(_capitalize(text), label) for text, label in scenario["people"]]
    options = [*people, (scenario["unknown"], "unknown")]  # person 0, person 1, unknown
    example_id = f"{scenario['id']}-{variant}-{polarity}"
    # A fixed, id-derived shuffle so the gold answer is not always in the same slot.
    digest = int(hashlib.sha256(example_id.encode()).hexdigest(), 16)
    order = _PERMUTATIONS[digest % len(_PERMUTATIONS)]
    shown = [options[k] for k in order]
    gold = order.index(2 if gold_person is None else gold_person)
    question = scenario["negative_question" if polarity == "neg" else "nonnegative_question"]
    return {
        "example_id": example_id,
        "question_index": scenario["id"],
        "question_polarity": polarity,
        "context_condition": "ambig" if variant == "ambig" else "disambig",
        "category": scenario["category"],
        "answer_info": {f"ans{k}": [text, label] for k, (text, label) in enumerate(shown)},
        "additional_metadata": {"stereotyped_groups": scenario["stereotyped"], "source": "flexsearch seed"},
        "context": context,
        "question": question,
        **{f"ans{k}": text for k, (text, _) in enumerate(shown)},
        "label": gold,
    }


def seed_records() -> list[tuple[int, dict[str, Any]]]:
    """(pseudo line number, BBQ record) for every seed item, in a fixed order: round-robin over categories."""
    text = resources.files("flexsearch.data").joinpath("seed_scenarios.yaml").read_text(encoding="utf-8")
    records: list[dict[str, Any]] = []
    for scenario in yaml.safe_load(text):
        people = [text for text, _ in scenario["people"]]
        for polarity in ("neg", "nonneg"):
            records.append(_record(scenario, "ambig", scenario["context"], polarity, None, 0))
        for wrongdoer in (0, 1):  # who the evidence says did the negative thing
            evidence = scenario["evidence"].format(neg=people[wrongdoer], nonneg=people[1 - wrongdoer])
            context = f"{scenario['context']} {_capitalize(evidence)}"
            variant = f"disambig{wrongdoer}"
            records.append(_record(scenario, variant, context, "neg", wrongdoer, 0))
            records.append(_record(scenario, variant, context, "nonneg", 1 - wrongdoer, 0))
    by_category: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        by_category.setdefault(record["category"], []).append(record)
    # Round-robin over categories, so the first N items (`--limit N`) cover every category.
    mixed = [r for turn in itertools.zip_longest(*by_category.values()) for r in turn if r is not None]
    return [(line, record) for line, record in enumerate(mixed, start=1)]
